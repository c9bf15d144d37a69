// write_mp4: RGB frames -> yuv420p (libswscale) -> H.264 (libavcodec, libx264) -> MP4
// (libavformat, +faststart), into the temporary file of an AtomicFile that is renamed over the
// target once the muxer has written its trailer. Every FFmpeg object is owned by a unique_ptr
// with its FFmpeg free function, so each way out (an error included) frees all of them.
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/dict.h>
#include <libavutil/error.h>
#include <libavutil/frame.h>
#include <libavutil/log.h>
#include <libswscale/swscale.h>
}

#include <ATen/ATen.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "cpu_offload/check.h"
#include "model_runner/output/frames_writer.h"
#include "output/atomic_file.h"
#include "output/frames_check.h"

namespace omni::models {
namespace {

constexpr int64_t kMaxFps = 1000;

std::string av_error(int err) {
  char text[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(err, text, sizeof(text));
  return text;
}

struct FormatCloser {
  void operator()(AVFormatContext* ctx) const {
    if (ctx->pb != nullptr) avio_closep(&ctx->pb);
    avformat_free_context(ctx);
  }
};
struct CodecCloser {
  void operator()(AVCodecContext* ctx) const { avcodec_free_context(&ctx); }
};
struct FrameCloser {
  void operator()(AVFrame* frame) const { av_frame_free(&frame); }
};
struct PacketCloser {
  void operator()(AVPacket* packet) const { av_packet_free(&packet); }
};
struct SwsCloser {
  void operator()(SwsContext* ctx) const { sws_freeContext(ctx); }
};
struct DictCloser {
  void operator()(AVDictionary** dict) const { av_dict_free(dict); }
};

// FFmpeg logs its progress at AV_LOG_INFO to stderr (x264's statistics, the muxer's
// "moving the moov atom"); an engine's output is no place for it. Warnings and errors stay.
void quiet_ffmpeg_info_logs() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (av_log_get_level() > AV_LOG_WARNING) av_log_set_level(AV_LOG_WARNING);
  });
}

// Encoder state for one file; `fail` names the target in every error.
class Mp4Encoder {
 public:
  Mp4Encoder(const std::string& target, const std::string& temp_path, int width, int height,
             int fps)
      : target_(target) {
    AVFormatContext* format = nullptr;
    check(avformat_alloc_output_context2(&format, nullptr, "mp4", temp_path.c_str()),
          "creating the MP4 muxer");
    format_.reset(format);

    const AVCodec* codec = avcodec_find_encoder_by_name("libx264");
    if (codec == nullptr) codec = avcodec_find_encoder(AV_CODEC_ID_H264);
    if (codec == nullptr) fail("this FFmpeg has no H.264 encoder (libx264)");
    stream_ = avformat_new_stream(format_.get(), nullptr);
    if (stream_ == nullptr) fail("creating the video stream: out of memory");
    codec_.reset(avcodec_alloc_context3(codec));
    if (!codec_) fail("creating the H.264 encoder: out of memory");
    codec_->width = width;
    codec_->height = height;
    codec_->pix_fmt = AV_PIX_FMT_YUV420P;
    codec_->time_base = AVRational{1, fps};
    codec_->framerate = AVRational{fps, 1};
    // libswscale's rgb24 -> yuv420p default: BT.601 matrix, limited range. Said in the stream,
    // so that players do not guess BT.709 for HD sizes.
    codec_->colorspace = AVCOL_SPC_SMPTE170M;
    codec_->color_range = AVCOL_RANGE_MPEG;
    if ((format_->oformat->flags & AVFMT_GLOBALHEADER) != 0) {
      codec_->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    }
    AVDictionary* options = nullptr;
    std::unique_ptr<AVDictionary*, DictCloser> options_guard(&options);
    av_dict_set(&options, "crf", "18", 0);
    av_dict_set(&options, "preset", "medium", 0);
    av_dict_set(&options, "x264-params", "log=1", 0);  // x264's own statistics: warnings only
    check(avcodec_open2(codec_.get(), codec, &options), "opening the H.264 encoder");
    check(avcodec_parameters_from_context(stream_->codecpar, codec_.get()),
          "setting the stream's parameters");
    stream_->time_base = codec_->time_base;
    stream_->avg_frame_rate = codec_->framerate;

    check(avio_open(&format_->pb, temp_path.c_str(), AVIO_FLAG_WRITE), "opening the file");
    AVDictionary* muxer_options = nullptr;
    std::unique_ptr<AVDictionary*, DictCloser> muxer_guard(&muxer_options);
    av_dict_set(&muxer_options, "movflags", "+faststart", 0);
    check(avformat_write_header(format_.get(), &muxer_options), "writing the MP4 header");

    sws_.reset(sws_getContext(width, height, AV_PIX_FMT_RGB24, width, height, AV_PIX_FMT_YUV420P,
                              SWS_BICUBIC | SWS_ACCURATE_RND, nullptr, nullptr, nullptr));
    if (!sws_) fail("creating the rgb24 -> yuv420p converter");
    frame_.reset(av_frame_alloc());
    rgb_.reset(av_frame_alloc());
    packet_.reset(av_packet_alloc());
    if (!frame_ || !rgb_ || !packet_) fail("out of memory");
    frame_->format = AV_PIX_FMT_YUV420P;
    rgb_->format = AV_PIX_FMT_RGB24;
    for (AVFrame* f : {frame_.get(), rgb_.get()}) {
      f->width = width;
      f->height = height;
      check(av_frame_get_buffer(f, 0), "allocating a frame");
      // The padding past each row is read (not used) by the SIMD code: defined, not garbage.
      for (AVBufferRef* buf : f->buf) {
        if (buf != nullptr) std::memset(buf->data, 0, buf->size);
      }
    }
  }

  // `rgb`: height rows of width * 3 bytes.
  void add(const uint8_t* rgb, int64_t index) {
    check(av_frame_make_writable(frame_.get()), "allocating a frame");
    // swscale's SIMD reads up to 16 bytes past a row's end: it reads from FFmpeg's padded
    // buffer, not from the tensor (whose last row ends its allocation).
    const size_t row_bytes = static_cast<size_t>(codec_->width) * 3;
    for (int y = 0; y < codec_->height; ++y) {
      std::memcpy(rgb_->data[0] + static_cast<ptrdiff_t>(y) * rgb_->linesize[0],
                  rgb + static_cast<size_t>(y) * row_bytes, row_bytes);
    }
    sws_scale(sws_.get(), rgb_->data, rgb_->linesize, 0, codec_->height, frame_->data,
              frame_->linesize);
    frame_->pts = index;
    check(avcodec_send_frame(codec_.get(), frame_.get()), "encoding a frame");
    drain();
  }

  void finish() {
    check(avcodec_send_frame(codec_.get(), nullptr), "flushing the encoder");
    drain();
    check(av_write_trailer(format_.get()), "writing the MP4 index");
    check(avio_closep(&format_->pb), "closing the file");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    OMNI_THROW("cannot write MP4 '", target_, "': ", what);
  }
  void check(int err, const char* what) const {
    if (err < 0) fail(std::string(what) + ": " + av_error(err));
  }

  // Hands every packet the encoder has ready to the muxer.
  void drain() {
    for (;;) {
      const int err = avcodec_receive_packet(codec_.get(), packet_.get());
      if (err == AVERROR(EAGAIN) || err == AVERROR_EOF) return;
      check(err, "encoding a frame");
      av_packet_rescale_ts(packet_.get(), codec_->time_base, stream_->time_base);
      packet_->stream_index = stream_->index;
      // Takes the packet's data and leaves packet_ blank for the next one.
      check(av_interleaved_write_frame(format_.get(), packet_.get()), "writing a packet");
    }
  }

  std::string target_;
  std::unique_ptr<AVFormatContext, FormatCloser> format_;
  AVStream* stream_ = nullptr;  // owned by format_
  std::unique_ptr<AVCodecContext, CodecCloser> codec_;
  std::unique_ptr<SwsContext, SwsCloser> sws_;
  std::unique_ptr<AVFrame, FrameCloser> frame_;  // yuv420p, the encoder's input
  std::unique_ptr<AVFrame, FrameCloser> rgb_;    // rgb24, swscale's input
  std::unique_ptr<AVPacket, PacketCloser> packet_;
};

}  // namespace

bool mp4_supported() { return true; }

void write_mp4(const std::string& path, const at::Tensor& frames, int64_t fps) {
  const at::Tensor data = output::checked_frames(frames, "write_mp4", path);
  OMNI_CHECK(fps >= 1 && fps <= kMaxFps, "write_mp4 '", path, "': fps must be 1 to ", kMaxFps,
             ", got ", fps);
  const int64_t height = data.size(1), width = data.size(2);
  OMNI_CHECK(height % 2 == 0 && width % 2 == 0, "write_mp4 '", path, "': H.264 yuv420p needs ",
             "an even width and height, got ", width, "x", height,
             " (width x height); crop or pad the frames");
  OMNI_CHECK(height <= 16384 && width <= 16384, "write_mp4 '", path, "': frames of ", width, "x",
             height, " are larger than H.264 allows (16384 a side)");
  quiet_ffmpeg_info_logs();

  output::AtomicFile file(path, "MP4");
  {
    Mp4Encoder encoder(path, file.temp_path(), static_cast<int>(width), static_cast<int>(height),
                       static_cast<int>(fps));
    // A frame at a time: the writer holds one frame's pixels beside the video, not a copy.
    for (int64_t i = 0; i < data.size(0); ++i) {
      const at::Tensor pixels = output::quantize_rgb8(data.narrow(0, i, 1), "write_mp4", path, i);
      encoder.add(pixels.data_ptr<uint8_t>(), i);
    }
    encoder.finish();
  }
  file.commit();  // the muxer wrote through its own descriptor; fsync on ours flushes the file
}

}  // namespace omni::models
