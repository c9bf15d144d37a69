#include "worker/rpc/auth.h"

#include <sys/random.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "cpu_offload/logging.h"

namespace omni::rpc {
namespace {

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(what + " '" + path + "' cannot be read");
  std::ostringstream content;
  content << in.rdbuf();
  if (in.bad()) throw std::runtime_error(what + " '" + path + "' cannot be read");
  return content.str();
}

std::string read_pem(const std::string& path, const std::string& what) {
  std::string pem = read_file(path, what);
  if (pem.find("-----BEGIN") == std::string::npos) {
    throw std::runtime_error(what + " '" + path + "' holds no PEM block (-----BEGIN ...)");
  }
  return pem;
}

}  // namespace

std::string bearer(const std::string& token) { return "Bearer " + token; }

std::string read_token_file(const std::string& path) {
  std::string token = read_file(path, "token file");
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (token.empty()) throw std::runtime_error("token file '" + path + "' is empty");
  return token;
}

std::string random_token() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // ENOSYS on an old kernel: /dev/urandom below
    got += static_cast<size_t>(n);
  }
  if (got < sizeof bytes) {
    std::ifstream urandom("/dev/urandom", std::ios::binary);
    if (!urandom.read(reinterpret_cast<char*>(bytes), sizeof bytes)) {
      throw std::runtime_error("cannot make a worker token: getrandom and /dev/urandom failed");
    }
  }
  static const char kHex[] = "0123456789abcdef";
  std::string token;
  for (const unsigned char b : bytes) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  return token;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Every byte of `a` is read whatever `b` holds; volatile keeps the compiler from stopping at
  // the first difference.
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    const unsigned char other = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | (static_cast<unsigned char>(a[i]) ^ other);
  }
  return diff == 0;
}

TokenCheck::TokenCheck(std::string token)
    : token_(std::move(token)), log_(std::make_shared<RateLimitedLog>(LogLevel::kWarning)) {}

grpc::Status TokenCheck::check(const grpc::ServerContext& context) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find(kAuthMetadataKey);
  const char* problem = "missing token";
  if (found != metadata.end()) {
    const std::string_view value(found->second.data(), found->second.size());
    const std::string_view prefix = "Bearer ";
    if (value.substr(0, prefix.size()) == prefix &&
        constant_time_equal(token_, value.substr(prefix.size()))) {
      return grpc::Status::OK;
    }
    problem = "wrong token";
  }
  log_->write("refused request from " + context.peer() + ": " + problem);
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      std::string("the worker refused the token (") + problem + ")");
}

std::shared_ptr<grpc::ServerCredentials> server_credentials(const std::string& cert_file,
                                                            const std::string& key_file) {
  if (cert_file.empty() && key_file.empty()) return grpc::InsecureServerCredentials();
  if (cert_file.empty() || key_file.empty()) {
    throw std::invalid_argument(
        "TLS needs both a certificate (--tls-cert) and its key "
        "(--tls-key)");
  }
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back(
      {read_pem(key_file, "TLS key file"), read_pem(cert_file, "TLS certificate file")});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const std::string& ca_file) {
  if (ca_file.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = read_pem(ca_file, "TLS CA file");
  return grpc::SslCredentials(options);
}

bool is_loopback_address(const std::string& address) {
  if (address.rfind("unix:", 0) == 0 || address.rfind("unix-abstract:", 0) == 0) return true;
  std::string host = address;
  for (const char* scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (host.rfind(scheme, 0) == 0) host = host.substr(std::string(scheme).size());
  }
  if (!host.empty() && host[0] == '[') {
    host = host.substr(
        1, host.find(']') == std::string::npos ? std::string::npos : host.find(']') - 1);
  } else if (std::count(host.begin(), host.end(), ':') == 1) {
    host = host.substr(0, host.find(':'));
  }
  // 127.0.0.0/8 as numbers only: "127.example.com" may resolve anywhere.
  const bool ipv4_loopback =
      host.rfind("127.", 0) == 0 && host.find_first_not_of("0123456789.") == std::string::npos;
  return host == "localhost" || ipv4_loopback || host == "::1";
}

}  // namespace omni::rpc
