// Test helper for the CLI tests (no Python needed):
//   npy_tool make DIR B S H HKV D   writes DIR/{q,k,v,dout}.npy with uniform random values
//   npy_tool diff A.npy B.npy TOL   exits 1 unless the shapes match and |a-b|/|b| <= TOL
//   npy_tool set A.npy I VALUE      sets flat element I to VALUE ("nan", "inf", "3e38")
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ulysses/core/error.hpp"
#include "ulysses/io/npy.hpp"
#include "ulysses/core/tensor.hpp"

using namespace ulysses;

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "make" && argc == 8) {
      const std::string dir = argv[2];
      const std::int64_t b = std::atoll(argv[3]), s = std::atoll(argv[4]), h = std::atoll(argv[5]),
                         hkv = std::atoll(argv[6]), d = std::atoll(argv[7]);
      const char* names[] = {"q", "k", "v", "dout"};
      for (int i = 0; i < 4; ++i) {
        const Shape shape{b, s, (i == 1 || i == 2) ? hkv : h, d};
        Tensor t(shape);
        fill_uniform(t.view(), 100 + std::uint64_t(i));
        write_npy(dir + "/" + names[i] + ".npy", t.f32(), {shape.b, shape.s, shape.h, shape.d});
      }
      return 0;
    }
    if (cmd == "diff" && argc == 5) {
      const NpyArray a = read_npy(argv[2]), b = read_npy(argv[3]);
      if (a.shape != b.shape) {
        std::printf("shapes differ\n");
        return 1;
      }
      double num = 0, den = 0;
      for (std::size_t i = 0; i < a.data.size(); ++i) {
        num += std::pow(double(a.data[i]) - b.data[i], 2);
        den += std::pow(double(b.data[i]), 2);
      }
      const double rel = std::sqrt(num / (den > 0 ? den : 1));
      std::printf("relative difference %.3e\n", rel);
      return rel <= std::atof(argv[4]) ? 0 : 1;
    }
    if (cmd == "set" && argc == 5) {
      NpyArray a = read_npy(argv[2]);
      a.data.at(std::size_t(std::atoll(argv[3]))) = std::strtof(argv[4], nullptr);
      write_npy(argv[2], a.data.data(), a.shape);
      return 0;
    }
    std::fprintf(stderr, "usage: npy_tool make DIR B S H HKV D | npy_tool diff A B TOL | npy_tool set A I VALUE\n");
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "npy_tool: %s\n", e.what());
    return 2;
  }
}
