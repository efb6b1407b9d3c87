// The one AMX tile configuration the kernels and the benchmark's AMX ceiling use: all eight
// tiles 16 rows × 64 bytes (16×16 float32 for C, 16×32 bf16 for A, 16 bf16 pairs × 16 columns
// for B). Internal linkage on purpose: the files that include this are compiled with AMX
// flags and must define no weak symbols (see tests/isa_symbols_test.sh).
#pragma once

#include <cstdint>

namespace ulysses::kernels::amx_tiles {
namespace {

// LDTILECFG's 64-byte operand: byte 0 the palette, colsb at 16, rows at 48.
struct alignas(64) TileConfig {
  std::uint8_t palette_id, start_row, reserved[14];
  std::uint16_t colsb[16];
  std::uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64);

constexpr TileConfig full_tiles() {
  TileConfig c{};
  c.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  return c;
}
constexpr TileConfig kFullTiles = full_tiles();

}  // namespace
}  // namespace ulysses::kernels::amx_tiles
