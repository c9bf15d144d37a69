// Hooks: chaining order, argument and result rewriting, method hooks, dotted paths, detach.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "cpu_offload/check.h"
#include "cpu_offload/hooks.h"

namespace omni::offload {
namespace {

// y = x * w + 1; decode(x) = x - 1.
class Affine : public HookableModule {
 public:
  Affine() : HookableModule("Affine", {"forward", "decode"}) {
    w = register_parameter("w", at::full({1}, 2.0), false);
  }
  at::Tensor forward(const at::Tensor& x) {
    return invoke("forward", {x},
                  [this](HookArgs& a) -> c10::IValue {
                    calls += 1;
                    return a[0].toTensor() * w + 1;
                  })
        .toTensor();
  }
  at::Tensor decode(const at::Tensor& x) {
    return invoke("decode", {x}, [](HookArgs& a) -> c10::IValue { return a[0].toTensor() - 1; })
        .toTensor();
  }
  at::Tensor w;
  int calls = 0;
};

class Outer : public torch::nn::Module {
 public:
  Outer() {
    inner = register_module("inner", std::make_shared<torch::nn::Module>("Inner"));
    leaf = inner->register_module("leaf", std::make_shared<Affine>());
    plain = register_module("plain", std::make_shared<torch::nn::Module>("Plain"));
  }
  std::shared_ptr<torch::nn::Module> inner, plain;
  std::shared_ptr<Affine> leaf;
};

// Records its calls in a shared log; optionally rewrites.
class RecordingHook : public ModelHook {
 public:
  RecordingHook(std::string tag, std::vector<std::string>* log) : tag_(std::move(tag)), log_(log) {}
  void on_attach(torch::nn::Module&, const std::string& method) override {
    log_->push_back(tag_ + ".attach." + method);
  }
  void on_detach(torch::nn::Module&, const std::string& method) override {
    log_->push_back(tag_ + ".detach." + method);
  }
  void pre_forward(torch::nn::Module&, const std::string& method, HookArgs& args) override {
    log_->push_back(tag_ + ".pre." + method);
    if (scale_input != 1.0) args[0] = args[0].toTensor() * scale_input;
  }
  void post_forward(torch::nn::Module&, const std::string& method, c10::IValue& out) override {
    log_->push_back(tag_ + ".post." + method);
    if (add_output != 0.0) out = out.toTensor() + add_output;
  }
  void on_forward_error(torch::nn::Module&, const std::string& method) override {
    log_->push_back(tag_ + ".error." + method);
  }
  void reset() override { log_->push_back(tag_ + ".reset"); }
  double scale_input = 1.0;
  double add_output = 0.0;

 private:
  std::string tag_;
  std::vector<std::string>* log_;
};

TEST(Hooks, ChainRunsPreInAttachOrderAndPostInReverse) {
  Affine m;
  std::vector<std::string> log;
  m.hooks().attach("forward", "a", std::make_shared<RecordingHook>("a", &log));
  m.hooks().attach("forward", "b", std::make_shared<RecordingHook>("b", &log));
  m.forward(at::ones({1}));
  EXPECT_EQ(log, (std::vector<std::string>{"a.attach.forward", "b.attach.forward", "a.pre.forward",
                                           "b.pre.forward", "b.post.forward", "a.post.forward"}));
}

TEST(Hooks, PreRewritesInputsAndPostRewritesOutputsInChainOrder) {
  Affine m;
  std::vector<std::string> log;
  auto a = std::make_shared<RecordingHook>("a", &log);
  auto b = std::make_shared<RecordingHook>("b", &log);
  a->scale_input = 3.0;   // x -> 3x
  b->scale_input = 5.0;   // -> 15x
  b->add_output = 10.0;   // inner post first: +10
  a->add_output = 100.0;  // then outer: +100
  m.hooks().attach("forward", "a", a);
  m.hooks().attach("forward", "b", b);
  const auto y = m.forward(at::full({1}, 1.0));
  // (1 * 15) * 2 + 1 + 10 + 100
  EXPECT_DOUBLE_EQ(y.item<double>(), 141.0);
}

TEST(Hooks, MethodHooksOnlySeeTheirMethod) {
  Affine m;
  std::vector<std::string> log;
  auto h = std::make_shared<RecordingHook>("h", &log);
  h->add_output = 7.0;
  m.hooks().attach("decode", "h", h);
  EXPECT_DOUBLE_EQ(m.forward(at::full({1}, 1.0)).item<double>(), 3.0);  // untouched
  EXPECT_DOUBLE_EQ(m.decode(at::full({1}, 1.0)).item<double>(), 7.0);   // (1 - 1) + 7
  EXPECT_EQ(log, (std::vector<std::string>{"h.attach.decode", "h.pre.decode", "h.post.decode"}));
}

TEST(Hooks, DetachRestoresOriginalOutputs) {
  Affine m;
  const auto x = at::arange(4, at::kFloat);
  const auto before = m.forward(x);
  std::vector<std::string> log;
  auto h = std::make_shared<RecordingHook>("h", &log);
  h->scale_input = -1.0;
  h->add_output = 0.5;
  m.hooks().attach("forward", "h", h);
  EXPECT_FALSE(at::equal(m.forward(x), before));
  EXPECT_TRUE(m.hooks().detach("forward", "h"));
  EXPECT_FALSE(m.hooks().detach("forward", "h"));
  EXPECT_FALSE(m.hooks().has_hooks("forward"));
  EXPECT_TRUE(at::equal(m.forward(x), before));
  EXPECT_EQ(log.back(), "h.detach.forward");
}

TEST(Hooks, DetachAllAndResetAll) {
  Affine m;
  std::vector<std::string> log;
  m.hooks().attach("forward", "a", std::make_shared<RecordingHook>("a", &log));
  m.hooks().attach("decode", "b", std::make_shared<RecordingHook>("b", &log));
  m.hooks().reset_all();
  m.hooks().detach_all();
  EXPECT_EQ(log, (std::vector<std::string>{"a.attach.forward", "b.attach.decode", "a.reset",
                                           "b.reset", "b.detach.decode", "a.detach.forward"}));
  EXPECT_TRUE(m.hooks().hook_names("forward").empty());
}

TEST(Hooks, AttachByDottedPathAtRunTime) {
  Outer root;
  std::vector<std::string> log;
  auto h = std::make_shared<RecordingHook>("h", &log);
  h->add_output = 1.0;
  find_hookable(root, "inner.leaf").hooks().attach("forward", "h", h);
  EXPECT_DOUBLE_EQ(root.leaf->forward(at::full({1}, 1.0)).item<double>(), 4.0);
  EXPECT_EQ(find_module(root, "inner").get(), root.inner.get());
  EXPECT_EQ(find_module(root, "").get(), &root);
}

TEST(Hooks, ClearErrors) {
  Outer root;
  try {
    find_module(root, "inner.leef");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'inner' has no child 'leef' (children: leaf)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(find_hookable(root, "plain"), Error);
  Affine m;
  std::vector<std::string> log;
  auto h = std::make_shared<RecordingHook>("h", &log);
  EXPECT_THROW(m.hooks().attach("encode", "h", h), Error);
  m.hooks().attach("forward", "h", h);
  EXPECT_THROW(m.hooks().attach("forward", "h", h), Error);
}

TEST(Hooks, FailedForwardUnwindsTheHooksThatEntered) {
  Affine m;
  std::vector<std::string> log;
  m.hooks().attach("forward", "a", std::make_shared<RecordingHook>("a", &log));
  m.hooks().attach("forward", "b", std::make_shared<RecordingHook>("b", &log));
  log.clear();
  struct Throwing : ModelHook {
    void pre_forward(torch::nn::Module&, const std::string&, HookArgs&) override {
      throw Error("refused");
    }
  };
  m.hooks().attach("forward", "c", std::make_shared<Throwing>());
  EXPECT_THROW(m.forward(at::ones({1})), Error);
  EXPECT_EQ(log, (std::vector<std::string>{"a.pre.forward", "b.pre.forward", "b.error.forward",
                                           "a.error.forward"}));
  EXPECT_EQ(m.calls, 0);  // the method did not run when a pre hook refused
}

TEST(Hooks, HookMayDetachItselfWhileRunning) {
  Affine m;
  struct SelfRemoving : ModelHook {
    HookRegistry* registry = nullptr;
    void post_forward(torch::nn::Module&, const std::string&, c10::IValue& out) override {
      out = out.toTensor() * 0;
      registry->detach("forward", "once");
    }
  };
  auto h = std::make_shared<SelfRemoving>();
  h->registry = &m.hooks();
  m.hooks().attach("forward", "once", h);
  EXPECT_DOUBLE_EQ(m.forward(at::ones({1})).item<double>(), 0.0);
  EXPECT_DOUBLE_EQ(m.forward(at::ones({1})).item<double>(), 3.0);
}

}  // namespace
}  // namespace omni::offload
