#include "ulysses/core/lengths.hpp"

#include <fmt/format.h>

#include <cmath>
#include <sstream>

#include "ulysses/core/error.hpp"

namespace ulysses {

namespace {

// Splitmix64: tiny, fast and specified exactly, so a spec means the same lengths everywhere
// (std::uniform_real_distribution's output is implementation-defined).
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!text.empty() && text.back() == sep) parts.emplace_back();
  return parts;
}

// A whole decimal integer in [lo, hi], else Error naming `what` in `term`.
std::int64_t parse_int(const std::string& text, const std::string& term, const char* what, std::int64_t lo,
                       std::int64_t hi) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || v < lo || v > hi)
    throw Error(
        fmt::format("--lengths term '{}': {} must be an integer in [{}, {}], got '{}'", term, what, lo, hi, text));
  return v;
}

double parse_positive(const std::string& text, const std::string& term, const char* what) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || !std::isfinite(v) || v <= 0)
    throw Error(fmt::format("--lengths term '{}': {} must be a finite number > 0, got '{}'", term, what, text));
  return v;
}

void add_pareto(const std::string& term, std::vector<std::int64_t>& out) {
  const std::vector<std::string> f = split(term, ':');
  if (f.size() != 5 && f.size() != 6)
    throw Error(fmt::format("--lengths term '{}': expected pareto:N:MIN:MAX:ALPHA[:SEED]", term));
  const std::int64_t n = parse_int(f[1], term, "N", 1, kMaxLengths);
  const std::int64_t lo = parse_int(f[2], term, "MIN", 1, std::int64_t(1) << 40);
  const std::int64_t hi = parse_int(f[3], term, "MAX", lo, std::int64_t(1) << 40);
  const double alpha = parse_positive(f[4], term, "ALPHA");
  std::uint64_t state = f.size() == 6 ? std::uint64_t(parse_int(f[5], term, "SEED", 0, INT64_MAX)) : 0;
  // Inverse CDF of the Pareto truncated to [lo, hi].
  const double ratio = std::pow(double(lo) / double(hi), alpha);
  for (std::int64_t i = 0; i < n; ++i) {
    const double u = double(splitmix64(state) >> 11) * 0x1.0p-53;
    const double x = double(lo) / std::pow(1.0 - u * (1.0 - ratio), 1.0 / alpha);
    out.push_back(std::min(hi, std::max(lo, std::int64_t(std::llround(x)))));
  }
}

void add_repeat(const std::string& term, std::vector<std::int64_t>& out) {
  const std::size_t x = term.find('x');
  const std::int64_t n = x == std::string::npos ? 1 : parse_int(term.substr(0, x), term, "the count", 1, kMaxLengths);
  const std::string len = x == std::string::npos ? term : term.substr(x + 1);
  const std::int64_t l = parse_int(len, term, "the length", 1, std::int64_t(1) << 40);
  out.insert(out.end(), std::size_t(n), l);
}

}  // namespace

std::vector<std::int64_t> parse_lengths(const std::string& spec) {
  std::vector<std::int64_t> out;
  for (const std::string& term : split(spec, ',')) {
    if (term.empty()) throw Error(fmt::format("--lengths '{}': an empty term (two commas, or one at an end)", spec));
    if (term.rfind("pareto:", 0) == 0)
      add_pareto(term, out);
    else
      add_repeat(term, out);
    if (std::int64_t(out.size()) > kMaxLengths)
      throw Error(fmt::format("--lengths '{}': more than {} sequences", spec, kMaxLengths));
  }
  if (out.empty()) throw Error(fmt::format("--lengths '{}': no sequence (expected e.g. 1x16384,32x512)", spec));
  return out;
}

std::string describe_lengths(const std::vector<std::int64_t>& lengths) {
  std::string text;
  for (std::size_t i = 0; i < lengths.size();) {
    std::size_t j = i;
    while (j < lengths.size() && lengths[j] == lengths[i]) ++j;
    text += fmt::format("{}{}x{}", text.empty() ? "" : ",", j - i, lengths[i]);
    i = j;
  }
  return text;
}

}  // namespace ulysses
