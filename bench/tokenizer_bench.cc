// Tokenizer throughput: encode MB/s on ~1 MB of mixed text (English prose, Chinese, code,
// whitespace runs) and on each kind alone, plus decode MB/s.
//
// Decision: the texts are generated from fixed fragments with a fixed seed, so runs are comparable
// across machines and commits without shipping a corpus; the best of several runs is reported
// (single-threaded, tokenizer loaded once).
//
// Usage: tokenizer_bench [TOKENIZER_DIR]   (default: tokenizers/kimi-k2, run from the repo root)
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace {

using klinear::Tokenizer;

const char* kEnglish[] = {
    "The quick brown fox jumps over the lazy dog. ",
    "In 2024, researchers measured a 3.5% improvement in throughput across 12 benchmarks. ",
    "She said, \"It's not what we expected,\" and they'd all agree it wasn't. ",
    "Transformers process tokens in parallel, while recurrent models carry a state forward. ",
    "HTTPServer instances handle getUserName requests at https://example.com/api/v1?id=42. ",
    "Linear attention replaces the softmax with a kernel feature map, trading accuracy for speed. ",
};
const char* kChinese[] = {
    "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
    "今天天气很好，我们去公园散步吧！",
    "大型语言模型通过预测下一个词元来生成文本，并在海量语料上进行训练。",
    "线性注意力机制的计算复杂度与序列长度成线性关系。",
    "“你好，世界！”这是每个程序员写的第一行代码。",
};
const char* kCode[] = {
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n",
    "for (int i = 0; i < n; ++i) {\n  out[i] = std::max(0.0f, in[i] * scale + bias[i]);\n}\n",
    "const result = await fetch(`/api/items/${id}`, { method: 'POST', body: JSON.stringify(data) });\n",
    "    if err != nil {\n        return nil, fmt.Errorf(\"open %s: %w\", path, err)\n    }\n",
    "SELECT user_id, COUNT(*) AS n FROM events WHERE ts > NOW() - INTERVAL '1 day' GROUP BY 1;\n",
};
const char* kWhitespace[] = {"\n\n", "    ", "\t\t", "\n        \n", "   \n", "\r\n", "                "};

enum class Mix { kMixed, kEnglish, kChinese, kCode, kWhitespace };

// ~`bytes` of text drawn from the fragment pools (fixed seed).
std::string make_text(Mix mix, size_t bytes) {
  std::mt19937 rng(1234);
  std::string s;
  while (s.size() < bytes) {
    Mix kind = mix;
    if (mix == Mix::kMixed) kind = static_cast<Mix>(1 + rng() % 4);
    switch (kind) {
      case Mix::kEnglish: s += kEnglish[rng() % std::size(kEnglish)]; break;
      case Mix::kChinese: s += kChinese[rng() % std::size(kChinese)]; break;
      case Mix::kCode: s += kCode[rng() % std::size(kCode)]; break;
      default: s += kWhitespace[rng() % std::size(kWhitespace)]; s += "x"; break;
    }
    if (rng() % 7 == 0) s += std::to_string(rng() % 100000) + " ";
  }
  return s;
}

template <typename F>
double best_ms(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (ms < best) best = ms;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : "tokenizers/kimi-k2";
  auto t0 = std::chrono::steady_clock::now();
  auto loaded = Tokenizer::load(dir);
  if (!loaded.ok()) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", loaded.status().to_string().c_str());
    return 2;
  }
  double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const Tokenizer& tok = loaded.value();
  std::printf("tokenizer %s loaded in %.1f ms (vocab %d)\n\n", dir.c_str(), load_ms, tok.vocab_size());
  std::printf("%-22s %10s %10s %10s %9s %12s\n", "case", "bytes", "tokens", "best ms", "MB/s", "tokens/s");

  struct Case {
    const char* name;
    Mix mix;
  };
  const Case cases[] = {{"encode mixed 1 MB", Mix::kMixed},  {"encode english", Mix::kEnglish},
                        {"encode chinese", Mix::kChinese},   {"encode code", Mix::kCode},
                        {"encode whitespace", Mix::kWhitespace}};
  const size_t kBytes = 1 << 20;
  const int kReps = 5;
  for (const Case& c : cases) {
    std::string text = make_text(c.mix, kBytes);
    std::vector<int32_t> ids;
    double ms = best_ms(kReps, [&] { ids = tok.encode(text); });
    if (tok.decode(ids) != text) {
      std::fprintf(stderr, "tokenizer_bench: %s does not round-trip\n", c.name);
      return 1;
    }
    std::printf("%-22s %10zu %10zu %10.2f %9.2f %12.0f\n", c.name, text.size(), ids.size(), ms,
                text.size() / 1e6 / (ms / 1e3), ids.size() / (ms / 1e3));
  }
  std::string mixed = make_text(Mix::kMixed, kBytes);
  std::vector<int32_t> ids = tok.encode(mixed);
  std::string out;
  double ms = best_ms(kReps, [&] { out = tok.decode(ids); });
  std::printf("%-22s %10zu %10zu %10.2f %9.2f %12.0f\n", "decode mixed 1 MB", out.size(), ids.size(), ms,
              out.size() / 1e6 / (ms / 1e3), ids.size() / (ms / 1e3));
  return 0;
}
