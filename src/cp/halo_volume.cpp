// The halo exchange's volume per member (ring_attention.hpp), for the planner and the traffic
// counters. Under an even cut the members' chunks are runs of even parts in position order, so
// the rows a band reaches are sums over ranges of runs, in closed form: O(log cp) a member where
// asking the members costs O(window / chunk) (at cp 65536 with a window of 4096, 8192 members a
// rank, 5·10^8 halo computations a plan). Per-document zigzag interleaves every member in every
// document: it still asks them.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>

#include "ring_attention.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/core/ranges.hpp"
#include "ulysses/core/saturating.hpp"
#include "ulysses/cp/token_layout.hpp"

namespace ulysses {

namespace {

using Wide = __int128;  // sums of positions over up to 2^17 runs; windows up to INT64_MAX

// A ring of members over an even cut of `seq` tokens into `parts` parts (even_part), in runs of
// `width` parts: member m holds run m and, mirrored (zigzag), run n − 1 − m of n = 2·members.
struct EvenRuns {
  std::int64_t seq, parts, width;
  bool mirrored;
  std::int64_t runs() const { return parts / width; }
  std::int64_t members() const { return mirrored ? runs() / 2 : runs(); }
  // Where part p starts (even_part's first item), and run j.
  std::int64_t part_start(std::int64_t p) const { return p * (seq / parts) + std::min(p, seq % parts); }
  std::int64_t start(std::int64_t j) const { return part_start(j * width); }
  std::int64_t end(std::int64_t j) const { return part_start((j + 1) * width); }
  // Σ start(j) over runs j < b.
  Wide starts_below(std::int64_t b) const {
    const Wide base = seq / parts, extra = seq % parts, w = width;
    const Wide k = std::min<Wide>(b, (extra + w - 1) / w);  // runs j < k start at j·w·(base + 1)
    return w * base * b * (b - 1) / 2 + w * k * (k - 1) / 2 + extra * (b - k);
  }
  int owner(std::int64_t j) const { return int(mirrored && j >= members() ? runs() - 1 - j : j); }
};

// The first run whose start is above z, and the first whose end is (runs() when none), in O(1):
// part_holding inverts even_part.
std::int64_t first_start_above(const EvenRuns& e, Wide z) {
  if (z < 0) return 0;
  if (z >= e.seq) return e.runs();
  return part_holding(e.seq, e.parts, std::int64_t(z)) / e.width + 1;
}
std::int64_t first_end_above(const EvenRuns& e, Wide z) {
  if (z < 0) return 0;
  if (z >= e.seq) return e.runs();
  return part_holding(e.seq, e.parts, std::int64_t(z)) / e.width;
}

// Σ over runs j in [j0, j1) of clamp(x − start(j), 0, len): the rows of a chunk ending at x − L
// (len rows) that the band of a run to its right reaches. Starts rise with j: the first runs
// reach all len rows, then x − start(j), then none.
Wide reach_from_right(const EvenRuns& e, std::int64_t j0, std::int64_t j1, Wide x, Wide len) {
  if (j0 >= j1) return 0;
  const std::int64_t full = std::clamp(first_start_above(e, x - len), j0, j1);
  const std::int64_t none = std::clamp(first_start_above(e, x - 1), full, j1);
  return len * (full - j0) + x * (none - full) - (e.starts_below(none) - e.starts_below(full));
}

// Σ over runs j in [j0, j1) of clamp(end(j) − y, 0, len): the rows of a chunk starting at y + R
// that the band of a run to its left reaches (end(j) = start(j + 1)).
Wide reach_from_left(const EvenRuns& e, std::int64_t j0, std::int64_t j1, Wide y, Wide len) {
  if (j0 >= j1) return 0;
  const std::int64_t some = std::clamp(first_end_above(e, y), j0, j1);
  const std::int64_t full = std::clamp(first_end_above(e, y + len - 1), some, j1);
  return (e.starts_below(full + 1) - e.starts_below(some + 1)) - y * (full - some) + len * (j1 - full);
}

struct Range {
  std::int64_t lo, hi;  // [lo, hi)
};

// The runs that meet positions [x, y).
Range runs_meeting(const EvenRuns& e, std::int64_t x, std::int64_t y) {
  const std::int64_t lo = first_end_above(e, x);
  return {lo, std::max(lo, first_start_above(e, Wide(y) - 1))};
}

// How many members other than one own a run of `runs`: the runs' owners as ranges of members
// (a mirrored run range splits at the middle), merged.
std::int64_t other_owners(const EvenRuns& e, const std::vector<Range>& runs) {
  std::vector<Range> owners;
  const std::int64_t m = e.members(), n = e.runs();
  for (const Range& r : runs) {
    if (!e.mirrored) {
      owners.push_back(r);
      continue;
    }
    if (r.lo < std::min(r.hi, m)) owners.push_back({r.lo, std::min(r.hi, m)});
    if (std::max(r.lo, m) < r.hi) owners.push_back({n - r.hi, n - std::max(r.lo, m)});
  }
  std::sort(owners.begin(), owners.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
  std::int64_t count = 0, covered = 0;  // members below `covered` counted
  for (const Range& r : owners) {
    count += std::max<std::int64_t>(0, r.hi - std::max(r.lo, covered));
    covered = std::max(covered, r.hi);
  }
  return count - 1;  // the member itself owns a run of each band
}

// Positions [lo, hi) of all bands, clipped to the sequence, counted once.
std::int64_t union_length(std::vector<Range> bands, std::int64_t seq) {
  std::sort(bands.begin(), bands.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
  std::int64_t n = 0, covered = 0;
  for (const Range& b : bands) {
    n += std::max<std::int64_t>(0, std::min(b.hi, seq) - std::max(b.lo, covered));
    covered = std::max(covered, std::min(b.hi, seq));
  }
  return n;
}

// The closed form. Query chunk a sees keys [a.begin − L, a.end + R) (R = 0 when causal); a member's
// runs are disjoint, so the rows of a chunk c another member's runs reach are their bands' union
// in c. Mirrored runs are causal (R = 0): only runs right of c reach it, each member's through
// its nearest there, the others' bands nested inside that one's.
HaloCounts even_halo(const EvenRuns& e, int me, std::int64_t left, std::int64_t right) {
  const std::int64_t m = e.members(), n = e.runs();
  std::vector<std::int64_t> own{me};
  if (e.mirrored) own.push_back(n - 1 - me);
  HaloCounts h;
  Wide given = 0;
  std::int64_t own_rows = 0;
  std::vector<Range> band, reach, sees, seen_by;  // positions; runs
  for (const std::int64_t j : own) {
    const std::int64_t s = e.start(j), t = e.end(j);
    own_rows += t - s;
    band.push_back({std::max<std::int64_t>(0, sat_sub(s, left)), sat_add(t, right)});
    reach.push_back({sat_sub(s, right), sat_add(t, left)});
    const Wide x = Wide(t) + left, len = t - s;
    if (!e.mirrored)
      given += reach_from_right(e, j + 1, n, x, len) + reach_from_left(e, 0, j, Wide(s) - right, len);
    else if (j == me)  // members above: their first run; below: their mirrored one
      given += reach_from_right(e, j + 1, m, x, len) + reach_from_right(e, n - me, n, x, len);
    else
      given += reach_from_right(e, j + 1, n, x, len);
  }
  for (const Range& b : band) sees.push_back(runs_meeting(e, b.lo, b.hi));
  for (const Range& r : reach) seen_by.push_back(runs_meeting(e, r.lo, r.hi));
  h.given = std::int64_t(given);
  h.held = union_length(band, e.seq) - own_rows;
  h.to = other_owners(e, seen_by);
  h.back = other_owners(e, sees);
  return h;
}

// `config`'s layout as an even cut for members of `width` ranks, if it is one.
std::optional<EvenRuns> even_runs(const CpConfig& config, int cp, int width, std::int64_t seq) {
  switch (token_layout(config)) {
    case TokenLayout::contiguous: return EvenRuns{seq, cp, width, false};
    case TokenLayout::zigzag: return EvenRuns{seq, 2 * std::int64_t(cp), width, true};
    case TokenLayout::per_document: return std::nullopt;
  }
  return std::nullopt;
}

// The position-sorted pieces, which tile [0, seq) (every token is one rank's): piece i is
// [begin[i], begin[i + 1]) of member member[i]. Twelve bytes a piece, not a struct's 24 with its
// end and padding: millions of pieces at 16M tokens, each pass reading them all.
struct Pieces {
  std::vector<std::int64_t> begin;  // size() + 1 entries: the last one is the sequence's end
  std::vector<std::int32_t> member;
  std::size_t size() const { return member.size(); }
  std::int64_t end(std::size_t i) const { return begin[i + 1]; }
};

// The marked pieces among positions [lo, hi) of the position-sorted pieces: how many, and the
// sum of their starts.
template <typename Int>
struct MarkedSpan {
  std::size_t lo, hi;
  std::int64_t count = 0;
  Int starts = 0;
  void take(std::int64_t begin, bool marked, int sign) {
    if (marked) count += sign, starts += sign * Int(begin);
  }
};

// The rows of piece k that its band [s − L, t) adds to its member's (whose last piece before it
// ends at `covered`): held rows, less its own.
std::int64_t band_rows(const Pieces& p, std::size_t k, std::int64_t left, std::int64_t seq, std::int64_t covered) {
  const std::int64_t from = std::max({std::int64_t(0), sat_sub(p.begin[k], left), covered});
  return std::max<std::int64_t>(0, std::min(p.end(k), seq) - from) - (p.end(k) - p.begin[k]);
}

// Every member's given rows (R = 0): from right to left, each member's nearest piece to the right
// is marked; a piece [s, t) gives clamp(t + L − start, 0, t − s) rows to each other member whose
// mark starts in [t, t + L) (union semantics: its nearest piece's band holds its others'): all
// of t − s to marks starting in [t, s + L] (span `full`), t + L − start to those in (s + L,
// t + L) (span `part`). As the sweep moves left both spans' ends only fall, so each piece enters
// and leaves each span once and a mark moved or dropped updates the span holding it: O(pieces)
// for the whole sweep. In `Int`: 64 bits where every sum fits them (swept_given below), as the
// 128 bits that windows up to INT64_MAX need cost twice the multiplies and adds. A piece is
// marked exactly when it is its member's nearest (no array of marks), and the member's held rows
// are added as its next piece's mark moves to it (the union of its bands: each band less the
// last piece's end), in the same pass.
template <typename Int>
std::vector<Int> swept_given(const Pieces& p, int members, std::int64_t left, std::int64_t seq,
                             std::vector<std::int64_t>& held) {
  std::vector<Int> given(static_cast<std::size_t>(members));
  std::vector<std::int64_t> nearest(static_cast<std::size_t>(members), -1);
  auto marked = [&](std::size_t k) { return nearest[std::size_t(p.member[k])] == std::int64_t(k); };
  MarkedSpan<Int> full{p.size(), p.size()}, part{p.size(), p.size()};
  for (std::size_t i = p.size(); i-- > 0;) {
    const Int x = Int(p.end(i)) + left, len = p.end(i) - p.begin[i];
    if (i + 1 < p.size()) --full.lo, full.take(p.begin[i + 1], true, 1);  // still its member's nearest
    // The first pieces starting at or after s + L + 1 (full.hi = part.lo) and at or after t + L
    // (part.hi): above i, as p.begin[i] is below both.
    for (; full.hi > i + 1 && p.begin[full.hi - 1] >= x - len + 1; part.lo = --full.hi) {
      full.take(p.begin[full.hi - 1], marked(full.hi - 1), -1);
      part.take(p.begin[full.hi - 1], marked(full.hi - 1), 1);
    }
    for (; part.hi > part.lo && p.begin[part.hi - 1] >= x; --part.hi)
      part.take(p.begin[part.hi - 1], marked(part.hi - 1), -1);
    Int g = len * full.count + x * part.count - part.starts;
    const std::size_t me = std::size_t(p.member[i]);
    if (nearest[me] >= 0) {  // the member's own next piece sends it nothing
      const std::size_t k = std::size_t(nearest[me]);
      g -= std::clamp(x - p.begin[k], Int(0), len);
      for (MarkedSpan<Int>* span : {&full, &part})
        if (span->lo <= k && k < span->hi) span->take(p.begin[k], true, -1);
      held[me] += band_rows(p, k, left, seq, p.end(i));
    }
    given[me] += g;
    nearest[me] = std::int64_t(i);
  }
  for (std::size_t me = 0; me < nearest.size(); ++me)  // each member's first piece
    if (nearest[me] >= 0) held[me] += band_rows(p, std::size_t(nearest[me]), left, seq, 0);
  return given;
}

// Every member's given rows, in 64 bits where the sweep's terms fit them: positions up to
// seq + L times counts up to pieces + members (the starts of marked pieces summed), with room;
// and its held rows, added to `held`.
std::vector<Wide> swept_given(const Pieces& p, int members, std::int64_t left, std::int64_t seq,
                              std::vector<std::int64_t>& held) {
  if (Wide(p.begin.back()) + left < (Wide(1) << 62) / (Wide(p.size()) + members + 2)) {
    const std::vector<std::int64_t> g = swept_given<std::int64_t>(p, members, left, seq, held);
    return std::vector<Wide>(g.begin(), g.end());
  }
  return swept_given<Wide>(p, members, left, seq, held);
}

// Each piece's partners' window (R = 0): the pieces starting in [end, end + L), as [i + 1, hi)
// of the position-sorted pieces (they tile: the next one starts at the end). hi only rises with
// i, so each pass that reads the windows in position order walks them once, none stored.
struct WindowCursor {
  const Pieces& p;
  std::int64_t left;
  std::size_t hi = 0;
  std::size_t operator()(std::size_t i) {
    hi = std::max(hi, i + 1);
    while (hi < p.size() && p.begin[hi] < Wide(p.end(i)) + left) ++hi;
    return hi;
  }
};

// Which of the segments (member_segments' starts) holds piece k, for k rising.
struct SegmentCursor {
  const std::vector<std::size_t>& starts;
  std::size_t s = 0;
  std::size_t operator()(std::size_t k) {
    while (starts[s + 1] <= k) ++s;
    return s;
  }
};

// Members up to which partners may be kept as bit sets (members² bits: 8 MiB).
constexpr std::size_t kBitMembers = 8192;

// Every member's row of bits: the members it sends to (members² bits, up to kBitMembers), its
// own bit cleared once counted. Kept from one split width for the next (fold_rows).
struct PartnerRows {
  std::size_t members = 0;
  std::vector<std::uint64_t> to;
};

// Every member's partners from its row of `words` words of bits (the members it sends to):
// `to` the row's bits, `back` the columns', its own bit cleared. The rows moved into `keep`, if
// given.
void count_partner_bits(std::vector<std::uint64_t>& to, std::size_t words, std::vector<HaloCounts>& h,
                        PartnerRows* keep) {
  for (std::size_t a = 0; a < h.size(); ++a) {
    to[a * words + a / 64] &= ~(std::uint64_t(1) << (a % 64));  // its own pieces in the window
    for (std::size_t x = 0; x < words; ++x)
      for (std::uint64_t bits = to[a * words + x]; bits != 0; bits &= bits - 1) {
        ++h[a].to;
        ++h[x * 64 + std::size_t(__builtin_ctzll(bits))].back;
      }
  }
  if (keep != nullptr) *keep = {h.size(), std::move(to)};
}

// The rows of members of k times the width (members / k of them): member a's partners are
// member a / k's once folded (a member of the wider split sends to another exactly when one of
// its narrower members sends to one of the other's: a joined piece's window is its last
// piece's, and the pieces of the other starting in it start joined pieces or lie in them, all
// after the joined piece's end). O(bits set), where sweeping the windows again is O(pieces).
std::vector<std::uint64_t> fold_rows(const PartnerRows& r, std::size_t k) {
  const std::size_t m = r.members / k, from = (r.members + 63) / 64, words = (m + 63) / 64;
  std::vector<std::uint64_t> to(m * words);
  for (std::size_t a = 0; a < r.members; ++a) {
    std::uint64_t* row = &to[a / k * words];
    for (std::size_t x = 0; x < from; ++x)
      for (std::uint64_t bits = r.to[a * from + x]; bits != 0; bits &= bits - 1) {
        const std::size_t b = (x * 64 + std::size_t(__builtin_ctzll(bits))) / k;
        row[b / 64] |= std::uint64_t(1) << (b % 64);
      }
  }
  return to;
}

// Partners from every piece's window, a stamp per window entry: O(pieces + Σ window sizes). Up
// to kBitMembers the stamps set bits of the members² in position order (1024 members: 128 KiB,
// in cache; the pieces read once, in order); beyond, each member's pieces together, a stamp per
// member seen (the windows' ends kept, read member by member).
void partners_by_stamps(const Pieces& p, std::int64_t left, std::vector<HaloCounts>& h, PartnerRows* keep) {
  const std::size_t m = h.size(), words = (m + 63) / 64;
  WindowCursor window{p, left};
  if (m <= kBitMembers) {
    std::vector<std::uint64_t> to(m * words);
    for (std::size_t i = 0; i < p.size(); ++i) {
      std::uint64_t* row = &to[std::size_t(p.member[i]) * words];
      for (std::size_t k = i + 1, hi = window(i); k < hi; ++k)
        row[std::size_t(p.member[k]) / 64] |= std::uint64_t(1) << (std::size_t(p.member[k]) % 64);
    }
    return count_partner_bits(to, words, h, keep);
  }
  std::vector<std::size_t> at(m + 1, 0), hi(p.size()), order(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) ++at[std::size_t(p.member[i]) + 1];
  for (std::size_t me = 1; me < at.size(); ++me) at[me] += at[me - 1];
  std::vector<std::size_t> next(at.begin(), at.end() - 1);
  for (std::size_t i = 0; i < p.size(); ++i) hi[i] = window(i), order[next[std::size_t(p.member[i])]++] = i;
  std::vector<std::size_t> seen(m, m);
  for (std::size_t me = 0; me < m; ++me)
    for (std::size_t x = at[me]; x < at[me + 1]; ++x)
      for (std::size_t k = order[x] + 1; k < hi[order[x]]; ++k) {
        const std::size_t r = std::size_t(p.member[k]);
        if (r == me || seen[r] == me) continue;
        seen[r] = me;
        ++h[me].to;
        ++h[r].back;
      }
}

// The same with a bit set of the window's owners OR-ed into each member's: O(pieces · members / 64)
// time, members² bits.
void partners_by_bits(const Pieces& p, std::int64_t left, std::vector<HaloCounts>& h, PartnerRows* keep) {
  const std::size_t m = h.size(), words = (m + 63) / 64;
  std::vector<std::uint64_t> to(m * words), window(words);
  std::vector<std::int64_t> in_window(m);
  auto flip = [&](std::size_t k, int step) {
    const std::size_t r = std::size_t(p.member[k]);
    if ((in_window[r] += step) == (step > 0 ? 1 : 0)) window[r / 64] ^= std::uint64_t(1) << (r % 64);
  };
  WindowCursor ends{p, left};
  std::size_t lo = 0, hi = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    for (const std::size_t end = ends(i); hi < end; ++hi) flip(hi, 1);
    for (; lo < std::min(i + 1, hi); ++lo) flip(lo, -1);
    const std::size_t me = std::size_t(p.member[i]);
    for (std::size_t x = 0; x < words; ++x) to[me * words + x] |= window[x];
  }
  count_partner_bits(to, words, h, keep);
}

// The position-sorted pieces as segments (starts, then p.size()) along which the member steps by
// 0 or 1 in one direction: the owners of any stretch of a segment are the members between its
// ends'. Per-document zigzag deals each document's chunks in sweeps over the ranks, so a window
// over thousands of pieces crosses a few segments.
std::vector<std::size_t> member_segments(const Pieces& p) {
  std::vector<std::size_t> starts{0};
  int dir = 0;
  for (std::size_t i = 1; i < p.size(); ++i) {
    const int d = p.member[i] - p.member[i - 1];
    if (d == 0 || ((d == 1 || d == -1) && (dir == 0 || dir == d))) {
      dir = d == 0 ? dir : d;
      continue;
    }
    starts.push_back(i);
    dir = 0;
  }
  starts.push_back(p.size());
  return starts;
}

// Members [lo, hi): half the memory of positions, millions of them at large cp.
struct Members {
  std::int32_t lo, hi;
};

// Calls f(i, first, last): piece i's nonempty window [i + 1, hi) and the segments it crosses,
// in position order; of pieces [lo, to) only, where given.
template <typename F>
void for_each_window(const Pieces& p, std::int64_t left, const std::vector<std::size_t>& starts, F&& f,
                     std::size_t lo = 0, std::size_t to = SIZE_MAX) {
  // The segment holding piece lo + 1 (the last start at or below it), where the cursors begin.
  const std::size_t s = std::size_t(std::upper_bound(starts.begin(), starts.end(), lo + 1) - starts.begin()) - 1;
  WindowCursor window{p, left};
  SegmentCursor first{starts, s}, last{starts, s};
  for (std::size_t i = lo; i + 1 < std::min(p.size(), to); ++i)
    if (const std::size_t hi = window(i); i + 1 < hi) f(i, first(i + 1), last(hi - 1), hi);
}

// Every piece's window as intervals of members, one a segment it crosses, grouped by the piece's
// member (intervals [at[me], at[me + 1]) are member me's): read in position order and placed by
// counting, where walking each member's pieces in turn reads the pieces out of order (a cache
// miss each at millions of pieces).
std::vector<Members> member_intervals(const Pieces& p, std::int64_t left, const std::vector<std::size_t>& starts,
                                      std::vector<std::size_t>& at) {
  for_each_window(p, left, starts, [&](std::size_t i, std::size_t s0, std::size_t s1, std::size_t) {
    at[std::size_t(p.member[i]) + 1] += s1 - s0 + 1;
  });
  for (std::size_t me = 1; me < at.size(); ++me) at[me] += at[me - 1];
  std::vector<Members> iv(at.back());
  std::vector<std::size_t> next(at.begin(), at.end() - 1);
  for_each_window(p, left, starts, [&](std::size_t i, std::size_t s0, std::size_t s1, std::size_t hi) {
    for (std::size_t s = s0; s <= s1; ++s) {
      const int x = p.member[std::max(starts[s], i + 1)], y = p.member[std::min(starts[s + 1], hi) - 1];
      iv[next[std::size_t(p.member[i])]++] = {std::min(x, y), std::max(x, y) + 1};
    }
  });
  return iv;
}

// Partners from each member's intervals marked on a difference array over the members and read
// in one pass: O(intervals + members) a member, no sort. Taken where members² is well below the
// intervals (cp 4096 under a window of 2048: 6·10^6 intervals, sorted in 1500s, a tenth of a
// second; 1.7·10^7 cells read, a few hundredths).
void partners_by_coverage(const std::vector<Members>& all, const std::vector<std::size_t>& at,
                          std::vector<HaloCounts>& h) {
  const std::size_t m = h.size();
  std::vector<std::int64_t> cover(m + 1), back(m, 0);
  for (std::size_t me = 0; me < m; ++me) {
    cover.assign(m + 1, 0);
    for (std::size_t k = at[me]; k < at[me + 1]; ++k) ++cover[std::size_t(all[k].lo)], --cover[std::size_t(all[k].hi)];
    std::int64_t running = 0, to = 0;
    bool self = false;  // its own pieces' windows may hold its own next pieces
    for (std::size_t r = 0; r < m; ++r) {
      running += cover[r];
      to += running > 0, back[r] += running > 0;
      if (r == me) self = running > 0;
    }
    h[me].to += to - self;
    back[me] -= self;
  }
  for (std::size_t r = 0; r < m; ++r) h[r].back += back[r];
}

// Sets bits [lo, hi) of a row of bits.
void set_bits(std::uint64_t* row, std::size_t lo, std::size_t hi) {
  const std::size_t a = lo / 64, b = (hi - 1) / 64;
  const std::uint64_t first = ~std::uint64_t(0) << (lo % 64), last = ~std::uint64_t(0) >> (63 - (hi - 1) % 64);
  if (a == b) {
    row[a] |= first & last;
    return;
  }
  row[a] |= first;
  for (std::size_t x = a + 1; x < b; ++x) row[x] = ~std::uint64_t(0);
  row[b] |= last;
}

// Each member's intervals of members not yet set in its row of bits: two, each widened by the
// intervals that meet it, so that a row is written only when a third disjoint one comes. The
// intervals a member's windows give mostly repeat (documents shorter than cp deal one run of
// ranks that goes on from document to document: each time the run comes round, a member's
// window holds the same members), and setting each in the row touched a line of a members² matrix
// a piece (2 MiB at 4096 members, past the core's cache).
struct PendingIntervals {
  std::vector<std::uint64_t>& to;
  std::size_t words;
  std::vector<Members> pending;  // two a member, empty when lo == hi
  void add(std::size_t me, Members r) {
    Members* slot = &pending[2 * me];
    for (Members* s : {slot, slot + 1})
      if (s->lo <= r.hi && r.lo <= s->hi) {  // they meet: one interval
        *s = {std::min(s->lo, r.lo), std::max(s->hi, r.hi)};
        return;
      }
    if (slot[1].lo < slot[1].hi) set_bits(&to[me * words], std::size_t(slot[1].lo), std::size_t(slot[1].hi));
    slot[1] = slot[0], slot[0] = r;
  }
  void flush() {
    for (std::size_t k = 0; k < pending.size(); ++k)
      if (pending[k].lo < pending[k].hi)
        set_bits(&to[k / 2 * words], std::size_t(pending[k].lo), std::size_t(pending[k].hi));
  }
};

// Partners from each window's members, one interval a segment it crosses, set as a range of
// bits in the row of the window's member (members² bits, up to kBitMembers), in position order:
// no intervals stored and placed by member (cp 4096, a window of 32: 2·10^7 of them, 160 MB
// scattered), a few words an interval, those that meet a member's last two joined first.
void partners_by_segment_bits(const Pieces& p, std::int64_t left, const std::vector<std::size_t>& starts,
                              std::vector<HaloCounts>& h, PartnerRows* keep) {
  const std::size_t words = (h.size() + 63) / 64;
  std::vector<std::uint64_t> to(h.size() * words);
  PendingIntervals rows{to, words, std::vector<Members>(2 * h.size(), Members{0, 0})};
  for_each_window(p, left, starts, [&](std::size_t i, std::size_t s0, std::size_t s1, std::size_t hi) {
    for (std::size_t s = s0; s <= s1; ++s) {
      const int x = p.member[std::max(starts[s], i + 1)], y = p.member[std::min(starts[s + 1], hi) - 1];
      rows.add(std::size_t(p.member[i]), {std::min(x, y), std::max(x, y) + 1});
    }
  });
  rows.flush();
  count_partner_bits(to, words, h, keep);
}

// Partners from each member's windows as intervals of members, one a segment a window crosses,
// merged; `back` by a difference array over the merged intervals. O(pieces + Σ segments crossed
// · log): the count does not grow with the windows' lengths.
void partners_by_segments(const Pieces& p, std::int64_t left, const std::vector<std::size_t>& starts,
                          std::vector<HaloCounts>& h, PartnerRows* keep) {
  const std::size_t m = h.size();
  if (m <= kBitMembers) return partners_by_segment_bits(p, left, starts, h, keep);
  std::vector<std::size_t> at(m + 1, 0);
  std::vector<Members> all = member_intervals(p, left, starts, at);
  if (Wide(m) * Wide(m) <= 8 * Wide(all.size())) return partners_by_coverage(all, at, h);
  std::vector<std::int64_t> diff(m + 1, 0);
  for (std::size_t me = 0; me < m; ++me) {
    const auto iv = std::span(all).subspan(at[me], at[me + 1] - at[me]);
    std::sort(iv.begin(), iv.end(), [](const Members& a, const Members& b) { return a.lo < b.lo; });
    std::int64_t covered = 0, count = 0;
    bool self = false;
    for (const Members& r : iv) {
      const std::int64_t lo = std::max<std::int64_t>(r.lo, covered);
      if (r.hi <= lo) continue;
      count += r.hi - lo, ++diff[std::size_t(lo)], --diff[std::size_t(r.hi)];
      self = self || (lo <= std::int64_t(me) && std::int64_t(me) < r.hi);
      covered = r.hi;
    }
    h[me].to += count - self;
    h[me].back -= self;  // counted in diff as its own partner
  }
  std::int64_t running = 0;
  for (std::size_t r = 0; r < m; ++r) h[r].back += running += diff[r];
}

// The window sizes summed past which stamps are too slow (a few seconds): beyond them and
// kBitMembers, the members are asked.
constexpr Wide kMostStamps = Wide(1) << 28;
// A crossed segment's price in stamps or bit-set words: an interval pushed, sorted and merged,
// where a stamp is a load and a compare and a word one OR. Segments are taken where they save
// an order of magnitude (cp 65536, documents of 512, a window of 4096: 2·10^6 crossings against
// 5·10^8 stamps), not where bit sets are about as cheap (cp 1024: both ~10^7).
constexpr Wide kSegmentCost = 16;
// Up to kBitMembers a crossed segment sets a range of bits (partners_by_segment_bits): two loads
// and a few words, about four stamps.
constexpr Wide kSegmentBitCost = 4;

// What counting partners `how` costs, in stamps: the windows' sizes summed (`stamps`), the
// segments they cross (`crossed`), and bit-set words.
struct PartnerCosts {
  Wide stamps = 0, crossed = 0, bits = 0;
};

// Pieces past which, up to kBitMembers, the costs are estimated from a sample of them: there
// every way counts the same partners and the costs only pick the fastest (the windows of 16M
// pieces read for it: a tenth of the sweep).
constexpr std::size_t kSampledPieces = std::size_t(1) << 20;
// The sample: this many blocks, evenly spaced, of a 16th of the pieces in all.
constexpr std::size_t kSampleBlocks = 64;

PartnerCosts partner_costs(const Pieces& p, std::int64_t left, const std::vector<std::size_t>& starts, std::size_t m,
                           bool estimate) {
  PartnerCosts c;
  auto add = [&](std::size_t i, std::size_t s0, std::size_t s1, std::size_t hi) {
    c.stamps += Wide(hi - i - 1), c.crossed += Wide(s1 - s0 + 1);
  };
  if (estimate && m <= kBitMembers && p.size() > kSampledPieces) {
    const std::size_t stride = p.size() / kSampleBlocks, block = stride / 16;
    for (std::size_t b = 0; b < kSampleBlocks; ++b)
      for_each_window(p, left, starts, add, b * stride, b * stride + block);
    const Wide sampled = Wide(kSampleBlocks * block);
    c.stamps = c.stamps * Wide(p.size()) / sampled, c.crossed = c.crossed * Wide(p.size()) / sampled;
  } else {
    for_each_window(p, left, starts, add);
  }
  c.bits = m > kBitMembers ? c.stamps + 1 : Wide(p.size()) * Wide((m + 63) / 64);
  return c;
}

// Every member's given rows (the sweep) and held rows (the union of its bands less its own).
std::vector<HaloCounts> given_and_held(const Pieces& p, int members, std::int64_t left, std::int64_t seq) {
  std::vector<std::int64_t> held(static_cast<std::size_t>(members), 0);
  const std::vector<Wide> given = swept_given(p, members, left, seq, held);
  std::vector<HaloCounts> h(held.size());
  for (std::size_t a = 0; a < h.size(); ++a) h[a].given = std::int64_t(given[a]), h[a].held = held[a];
  return h;
}

// The per-document layout's counts of every member at once (R = 0: causal): given by the sweep,
// held as the union of the member's bands less its own rows, the partners from each piece's
// window (stamps, bit sets or member segments, whichever costs least). Empty when all cost too much.
// `rows`, if given: a narrower split's partner rows of the same layout and window, folded instead
// of reading the windows when this width is a multiple of theirs; replaced by this width's.
std::optional<std::vector<HaloCounts>> swept_halo_counts(const Pieces& p, int members, std::int64_t left,
                                                         std::int64_t seq, PartnerCount how, SweepWork* work,
                                                         PartnerRows* rows = nullptr) {
  const std::size_t m = std::size_t(members);
  if (rows != nullptr && how == PartnerCount::cheapest && rows->members > m && rows->members % m == 0) {
    std::vector<HaloCounts> h = given_and_held(p, members, left, seq);
    std::vector<std::uint64_t> to = fold_rows(*rows, rows->members / m);
    count_partner_bits(to, (m + 63) / 64, h, rows);
    return h;
  }
  const std::vector<std::size_t> starts = member_segments(p);
  const PartnerCosts cost = partner_costs(p, left, starts, m, work == nullptr);
  if (how == PartnerCount::cheapest) {
    if (std::min(cost.stamps, cost.crossed) > kMostStamps && m > kBitMembers) return std::nullopt;
    how = (m <= kBitMembers ? kSegmentBitCost : kSegmentCost) * cost.crossed < std::min(cost.stamps, cost.bits)
              ? PartnerCount::segments
              : (cost.stamps <= cost.bits ? PartnerCount::stamps : PartnerCount::bits);
  }
  std::vector<HaloCounts> h = given_and_held(p, members, left, seq);
  if (work != nullptr)
    *work = {std::int64_t(p.size()),
             std::int64_t(how == PartnerCount::segments ? cost.crossed
                          : how == PartnerCount::stamps ? cost.stamps
                                                        : Wide(p.size()) * Wide((m + 63) / 64))};
  if (how == PartnerCount::segments)
    partners_by_segments(p, left, starts, h, rows);
  else if (how == PartnerCount::stamps)
    partners_by_stamps(p, left, h, rows);
  else
    partners_by_bits(p, left, h, rows);
  return h;
}

// Where each member of one rank starts a piece: a piece a run of its chunks, in position order.
struct PieceWriter {
  Pieces& p;
  std::int64_t at = 0;  // the next chunk's first position
  void add(std::int64_t rank, std::int64_t length) {
    if (length > 0 && (p.member.empty() || p.member.back() != rank))
      p.begin.push_back(at), p.member.push_back(std::int32_t(rank));
    at += length;
  }
};

// The pieces of members of one rank, straight from the documents' cuts: what
// for_each_member_chunk deals at width 1 (its for_each_document_cut: a document of n tokens in
// 2·cp chunks of n / 2cp, the first chunks of a run of n mod 2cp ranks (up to cp) forward from
// where the last document's run ended one longer, and the mirror chunks of a run of the rest
// backward from where the last one's began), with no call through a std::function a chunk: 16M
// one-token chunks for 16M tokens of short documents, a tenth of the plan.
Pieces rank_pieces(const std::vector<std::int64_t>& cu, int cp) {
  Pieces p;
  const std::int64_t parts = 2 * std::int64_t(cp), docs = std::int64_t(cu.size()) - 1;
  p.begin.reserve(std::size_t(std::min(cu.back(), parts * docs) + 1));
  p.member.reserve(p.begin.capacity() - 1);
  PieceWriter out{p};
  auto in_run = [&](std::int64_t r, std::int64_t first, std::int64_t count) { return (r - first + cp) % cp < count; };
  std::int64_t forward = 0, backward = 0;
  for (std::size_t i = 1; i < cu.size(); ++i) {
    const std::int64_t n = cu[i] - cu[i - 1], base = n / parts, heads = std::min<std::int64_t>(n % parts, cp),
                       tails = n % parts - heads, back = (backward - tails + cp) % cp;
    if (base > 0) {
      for (std::int64_t r = 0; r < cp; ++r) out.add(r, base + in_run(r, forward, heads));
      for (std::int64_t r = cp; r-- > 0;) out.add(r, base + in_run(r, back, tails));
    } else {  // a token on each rank of the runs: those wrapped past cp − 1 come first rising, last falling
      for (std::int64_t r = 0; r < forward + heads - cp; ++r) out.add(r, 1);
      for (std::int64_t r = forward; r < std::min<std::int64_t>(forward + heads, cp); ++r) out.add(r, 1);
      for (std::int64_t r = std::min<std::int64_t>(back + tails, cp); r-- > back;) out.add(r, 1);
      for (std::int64_t r = back + tails - cp; r-- > 0;) out.add(r, 1);
    }
    forward = (forward + heads) % cp, backward = back;
  }
  p.begin.push_back(out.at);
  return p;
}

// The chunks of `config`'s layout in position order (for_each_member_chunk: a member's adjacent
// chunks in a document already joined), each run of adjacent chunks of one member joined into
// one piece: the member holds the same positions, so its
// band's union, the rows others' bands reach in it and its partners are the same (a joined
// piece's partner window [end, end + L) is its last chunk's; its earlier chunks' windows add
// only its own chunks and positions no piece starts at). A member of `width` ranks holds runs of
// `width` consecutive ranks' chunks (per-document zigzag deals a document's chunks over the
// ranks in order, then back), so the sweep visits about chunks / width pieces, not chunks, for
// every split width.
Pieces pieces_of(const CpConfig& config, int cp, int width, std::int64_t seq) {
  if (width == 1 && token_layout(config) == TokenLayout::per_document) {
    check_rank_chunks(config, cp, seq);
    return rank_pieces(config.cu_seqlens, cp);
  }
  Pieces pieces;
  // At most min(seq, 2·cp) chunks a document, about a width-th of them joined: reserved (and
  // touched only as filled), not grown by copying millions of pieces.
  const std::int64_t docs = std::max<std::int64_t>(1, std::int64_t(config.cu_seqlens.size()) - 1),
                     chunks = std::min(seq, 2 * std::int64_t(cp) * docs);
  pieces.begin.reserve(std::size_t(chunks / width + 2 * docs + 2));
  pieces.member.reserve(std::size_t(chunks / width + 2 * docs + 1));
  std::int64_t end = 0;
  for_each_member_chunk(config, cp, width, seq, [&](int m, const SeqChunk& c) {
    if (c.begin != end) throw Error(fmt::format("halo sweep: a chunk at {} after the chunks up to {}", c.begin, end));
    end += c.length;
    if (pieces.member.empty() || pieces.member.back() != m) pieces.begin.push_back(c.begin), pieces.member.push_back(m);
  });
  pieces.begin.push_back(end);
  return pieces;
}

// Members of `k` times the width: each k consecutive members joined into one, and the pieces
// that become adjacent pieces of one member joined, in place. The planner sweeps the split widths
// 1, 2, 4, ... in turn: each width's pieces from the last one's in a pass over them, where
// for_each_member_chunk walks every document's cut again (a third of the sweep at 16M tokens).
// The wider member: a shift where k is a power of two (every split width the planner sweeps),
// where a division a piece was half of the pass.
template <typename Wider>
void join_members_by(Pieces& p, Wider wider) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const std::int32_t m = wider(p.member[i]);
    if (n > 0 && p.member[n - 1] == m) continue;
    p.begin[n] = p.begin[i], p.member[n] = m, ++n;
  }
  p.begin[n] = p.begin.back();
  p.begin.resize(n + 1), p.member.resize(n);
}

void join_members(Pieces& p, std::int32_t k) {
  if (std::has_single_bit(std::uint32_t(k))) {
    const int shift = std::countr_zero(std::uint32_t(k));
    return join_members_by(p, [shift](std::int32_t m) { return m >> shift; });
  }
  join_members_by(p, [k](std::int32_t m) { return m / k; });
}

// Documents whose lengths repeat every `docs` documents, after which per-document zigzag's cuts
// are back where they started (each document is dealt from the ranks where the last one left
// off): every repetition is cut the same way, `tokens` further on. The repetitions hold the first
// `repeating` documents; those after them (a tail that breaks the pattern: `1048575x16,15,1`) are
// swept whole, after as many repetitions as the sweep takes.
struct LayoutPeriod {
  std::size_t docs;
  std::int64_t tokens;
  std::size_t repeating;
};

// The repetitions a sweep of the tail must hold for its counts to extrapolate: a window's
// repetitions on each side of an inner one (periodic_halo_counts), for a window up to INT64_MAX.
Wide first_repetitions(std::int64_t left, std::int64_t tokens) { return 2 * (Wide(left) / tokens + 2) + 1; }

// How many times the runs of longer chunks that documents [0, q) deal (heads forward, tails
// backward) must repeat to come back to their ranks mod cp; heads and tails summed mod cp.
std::int64_t cut_repeats(std::int64_t heads, std::int64_t tails, int cp) {
  return std::lcm(cp / std::gcd(heads % cp, std::int64_t(cp)), cp / std::gcd(tails % cp, std::int64_t(cp)));
}

// The prefix function of the first m lengths of `cu`: border[i], the longest proper border of
// lengths [0, i]; the prefix of i + 1 lengths has smallest period i + 1 − border[i].
std::vector<std::uint32_t> length_borders(const std::vector<std::int64_t>& cu, std::size_t m) {
  auto length = [&](std::size_t i) { return cu[i + 1] - cu[i]; };
  std::vector<std::uint32_t> border(m, 0);
  for (std::size_t i = 1; i < m; ++i) {
    std::size_t k = border[i - 1];
    while (k > 0 && length(i) != length(k)) k = border[k - 1];
    border[i] = std::uint32_t(k + (length(i) == length(k)));
  }
  return border;
}

// The smallest period of all n lengths where it is at most `longest`, from the prefix function
// of the first 2·longest + 1 only, checked on the rest in one pass that writes nothing (16M
// documents: 64 MB of borders not written): if all have a period P ≤ longest, the prefix's
// smallest period p and P are both periods of a prefix longer than p + P, so gcd(p, P) is one
// too (Fine and Wilf): p is that gcd, hence a period of all the lengths, and P = p. Empty where
// the prefix's is longer or the check fails (the smallest period may then be anything).
std::optional<std::size_t> short_period(const std::vector<std::int64_t>& cu, std::size_t longest) {
  const std::size_t n = cu.size() - 1, m = std::min(n, 2 * longest + 1);
  if (m == 0) return std::nullopt;
  const std::size_t p = m - length_borders(cu, m)[m - 1];
  if (p > longest) return std::nullopt;
  for (std::size_t i = m; i < n; ++i)
    if (cu[i + 1] - cu[i] != cu[i + 1 - p] - cu[i - p]) return std::nullopt;
  return p;
}

// The runs of longer chunks that the first documents deal, up to the longest period that can
// pay (a period repeats at least 5 times, first_repetitions, in each of the sweeps of 6 · (5 +
// 3) periods): heads[q] and tails[q], those of documents [0, q), mod cp.
struct PeriodRuns {
  std::size_t longest;
  std::vector<std::int64_t> heads, tails;
};

PeriodRuns period_runs(const std::vector<std::int64_t>& cu, int cp) {
  const std::size_t n = cu.size() - 1;
  PeriodRuns r{n / 48 + 1, {}, {}};
  const std::int64_t parts = 2 * std::int64_t(cp);
  r.heads.assign(r.longest + 1, 0), r.tails.assign(r.longest + 1, 0);
  for (std::size_t i = 0; i < r.longest && i < n; ++i) {
    const std::int64_t length = cu[i + 1] - cu[i], h = std::min<std::int64_t>(length % parts, cp);
    r.heads[i + 1] = (r.heads[i] + h) % cp, r.tails[i + 1] = (r.tails[i] + length % parts - h) % cp;
  }
  return r;
}

// The prefix of k documents with smallest period q as the layout's period, if it pays: q short
// enough, and three sweeps of a few repetitions and the tail cost at most a sixth of the documents.
std::optional<LayoutPeriod> period_at(const std::vector<std::int64_t>& cu, const PeriodRuns& r, int cp,
                                      std::int64_t left, std::size_t k, std::size_t q) {
  const std::size_t n = cu.size() - 1;
  if (q > r.longest || cu[q] <= 0) return std::nullopt;
  const std::int64_t repeats = cut_repeats(r.heads[q], r.tails[q], cp);
  const Wide docs = Wide(q) * repeats, a0 = first_repetitions(left, repeats * cu[q]);
  if (docs <= Wide(k) && ((a0 + 3) * docs + Wide(n - k)) * 6 <= Wide(n))
    return LayoutPeriod{std::size_t(docs), repeats * cu[q], k};
  return std::nullopt;
}

// The lengths' longest prefix that repeats with a short enough period that three sweeps of a few
// repetitions and the tail after it cost at most a sixth of the documents: the prefixes' smallest
// periods (a prefix function over the lengths, O(documents)) only fall as the prefix shortens, so
// each period is tried at its longest prefix, from the whole list down while the tail is short.
// The whole list first, from its short period (short_period) where it has one: a list that
// repeats to its end needs no prefix function over all of it.
std::optional<LayoutPeriod> layout_period(const std::vector<std::int64_t>& cu, int cp, std::int64_t left) {
  const std::size_t n = cu.size() - 1;
  const PeriodRuns runs = period_runs(cu, cp);
  if (const std::optional<std::size_t> q = short_period(cu, runs.longest))
    if (std::optional<LayoutPeriod> whole = period_at(cu, runs, cp, left, n, *q)) return whole;
  const std::vector<std::uint32_t> border = length_borders(cu, n);
  for (std::size_t k = n; k > 0 && 6 * (n - k) <= n;) {
    const std::size_t q = k - border[k - 1];
    if (std::optional<LayoutPeriod> p = period_at(cu, runs, cp, left, k, q)) return p;
    while (k > 0 && k - border[k - 1] >= q) --k;  // the longest prefix of a shorter period
  }
  return std::nullopt;
}

// Documents [0, count) of `cu` then the documents from `from` on, as boundaries.
void cut_documents(const std::vector<std::int64_t>& cu, std::size_t count, std::size_t from,
                   std::vector<std::int64_t>& out) {
  out.assign(cu.begin(), cu.begin() + std::ptrdiff_t(count) + 1);
  for (std::size_t i = from; i + 1 < cu.size(); ++i) out.push_back(out.back() + cu[i + 1] - cu[i]);
}

// f[0] + more·(f[1] − f[0]) for every member and count, where the three sweeps (a0, a0 + 1 and
// a0 + 2 periods) grow linearly; empty where they do not (the argument below failed).
std::optional<std::vector<HaloCounts>> extrapolated(const std::array<std::vector<HaloCounts>, 3>& f, Wide more) {
  std::vector<HaloCounts> out(f[0].size());
  for (std::size_t m = 0; m < out.size(); ++m) {
    const std::array<std::int64_t HaloCounts::*, 4> fields{&HaloCounts::given, &HaloCounts::held, &HaloCounts::to,
                                                           &HaloCounts::back};
    for (const auto x : fields) {
      const std::int64_t d = f[1][m].*x - f[0][m].*x;
      if (f[2][m].*x - f[1][m].*x != d) return std::nullopt;
      out[m].*x = std::int64_t(f[0][m].*x + more * d);
    }
  }
  return out;
}

// The width-1 pieces of the three sweeps below: a0, a0 + 1 and a0 + 2 periods, then the rest of
// a period and the tail. Cut straight from the boundaries `cu`: no config is copied for them,
// which copied all the boundaries (16M documents: 128 MB a split width) to keep a few periods.
using PeriodicPieces = std::array<Pieces, 3>;
PeriodicPieces periodic_pieces(const std::vector<std::int64_t>& cu, int cp, std::int64_t left,
                               const LayoutPeriod& period) {
  const std::size_t rest = period.repeating % period.docs;
  const Wide a0 = first_repetitions(left, period.tokens);
  PeriodicPieces out;
  std::vector<std::int64_t> part;  // the documents kept, cut shorter for each sweep
  for (std::size_t k = 0; k < out.size(); ++k) {
    cut_documents(cu, (std::size_t(a0) + k) * period.docs + rest, period.repeating, part);
    out[k] = rank_pieces(part, cp);
  }
  return out;
}

// A piece's counts depend only on the pieces within L tokens of it (its band, the marks and
// partner windows it reads, the band of its member's previous piece): the pieces of a period
// more than L + a period from both ends count the same as the next period's. So with `a`
// periods and the r documents left over (the tail), each count is f(a) = f(a0) + (a − a0)·(f(a0 +
// 1) − f(a0)) once the a0 periods hold an inner one (additive counts grow by the inner period's;
// partners, a union, stop growing): three sweeps of a few periods for millions of pieces.
// `pieces`: periodic_pieces joined to `members` members.
std::optional<std::vector<HaloCounts>> extrapolated_counts(const PeriodicPieces& pieces, int members, std::int64_t left,
                                                           const LayoutPeriod& period) {
  std::array<std::vector<HaloCounts>, 3> f;
  for (std::size_t k = f.size(); k-- > 0;) {
    std::optional<std::vector<HaloCounts>> h =
        swept_halo_counts(pieces[k], members, left, pieces[k].begin.back(), PartnerCount::cheapest, nullptr);
    if (!h) return std::nullopt;
    f[k] = std::move(*h);
  }
  return extrapolated(f, Wide(period.repeating / period.docs) - first_repetitions(left, period.tokens));
}

// The layout's period, if its documents repeat under a bounded window (layout_period).
std::optional<LayoutPeriod> period_of(const CpConfig& config, int cp, std::int64_t seq) {
  const std::int64_t left = config.window_left;
  if (token_layout(config) != TokenLayout::per_document || left < 0 || seq != config.cu_seqlens.back())
    return std::nullopt;
  return layout_period(config.cu_seqlens, cp, left);
}

}  // namespace

std::optional<std::vector<HaloCounts>> periodic_halo_counts(const CpConfig& config, int cp, int width,
                                                            std::int64_t seq) {
  const std::optional<LayoutPeriod> period = period_of(config, cp, seq);
  if (!period) return std::nullopt;
  PeriodicPieces pieces = periodic_pieces(config.cu_seqlens, cp, config.window_left, *period);
  if (width > 1)
    for (Pieces& p : pieces) join_members(p, width);
  return extrapolated_counts(pieces, cp / width, config.window_left, *period);
}

namespace {

// The pieces of `config`'s layout for members of `width` ranks: the last ones joined when they
// are of the same documents, cp and seq and `width` is a multiple of their width, else anew.
const Pieces& member_pieces(const CpConfig& config, int cp, int width, std::int64_t seq) {
  struct Last {
    std::uint64_t documents = 0;
    std::int64_t cp = 0, seq = 0;
    int width = 0;
    Pieces pieces;
  };
  thread_local Last last;
  const std::uint64_t documents = documents_generation(config);
  if (last.width > 0 && width % last.width == 0 && last.cp == cp && last.seq == seq && last.documents == documents) {
    if (width != last.width) join_members(last.pieces, width / last.width);
  } else {
    last.pieces = {};  // freed before the new ones are built
    last = {documents, cp, seq, width, pieces_of(config, cp, width, seq)};
  }
  last.width = width;
  return last.pieces;
}

// The layout's period (period_of) of the last documents, cp, seq and window: the planner asks it
// at every split width, and finding it reads every document (a prefix function over them).
// `documents`: documents_generation of config's.
const LayoutPeriod* memo_period(const CpConfig& config, int cp, std::int64_t seq, std::uint64_t documents) {
  struct Last {
    std::uint64_t documents = 0;
    std::array<std::int64_t, 3> sizes{};  // cp, seq, window_left
    std::optional<LayoutPeriod> period;
  };
  thread_local Last last;
  const std::array<std::int64_t, 3> sizes{cp, seq, config.window_left};
  if (last.documents != documents || last.sizes != sizes) last = {documents, sizes, period_of(config, cp, seq)};
  return last.period ? &*last.period : nullptr;
}

// The partner rows of the last sweep of the same documents (their documents_generation), cp, seq
// and window, for the next split width to fold (swept_halo_counts); emptied when they change.
PartnerRows& memo_rows(int cp, std::int64_t seq, std::int64_t left, std::uint64_t documents) {
  struct Last {
    std::uint64_t documents = 0;
    std::array<std::int64_t, 3> sizes{};  // cp, seq, window_left
    PartnerRows rows;
  };
  thread_local Last last;
  const std::array<std::int64_t, 3> sizes{cp, seq, left};
  if (last.documents != documents || last.sizes != sizes) last = {documents, sizes, {}};
  return last.rows;
}

// The periodic sweeps' pieces (periodic_pieces) for members of `width` ranks, of the last
// documents, cp, seq and window: the planner asks each split width 1, 2, 4, ... in turn, so the
// last width's are joined (join_members), not cut from the boundaries again (at cp 65536 with
// one-token documents: 1.2M pieces a width). Null where the layout has no period.
const PeriodicPieces* memo_periodic_pieces(const CpConfig& config, int cp, int width, std::int64_t seq,
                                           std::uint64_t documents) {
  const LayoutPeriod* period = memo_period(config, cp, seq, documents);
  if (period == nullptr) return nullptr;
  struct Last {
    std::uint64_t documents = 0;
    std::array<std::int64_t, 3> sizes{};  // cp, seq, window_left
    int width = 0;
    PeriodicPieces pieces;
  };
  thread_local Last last;
  const std::array<std::int64_t, 3> sizes{cp, seq, config.window_left};
  if (last.width == 0 || last.documents != documents || last.sizes != sizes || width % last.width != 0) {
    last.pieces = {};  // freed before the new ones are built
    last = {documents, sizes, 1, periodic_pieces(config.cu_seqlens, cp, config.window_left, *period)};
  }
  if (width != last.width)
    for (Pieces& p : last.pieces) join_members(p, width / last.width);
  last.width = width;
  return &last.pieces;
}

// Every member's counts by the sweep, when `config`'s layout is per-document zigzag (causal).
// traffic() asks one rank at a time (every distinct key: up to every rank), so the last sweep is
// kept for the next rank of the same layout (it reads the documents, cp, width, seq and window),
// and lent, not copied: a copy a rank is cp² counts.
const std::vector<HaloCounts>* swept_members(const CpConfig& config, int cp, int width, std::int64_t seq) {
  const int members = cp / width;
  if (token_layout(config) != TokenLayout::per_document) return nullptr;
  struct Last {
    std::uint64_t documents = 0;
    std::array<std::int64_t, 4> sizes{};  // cp, width, seq, window_left
    std::vector<HaloCounts> counts;
  };
  thread_local Last last;
  const std::array<std::int64_t, 4> sizes{cp, width, seq, config.window_left};
  const std::uint64_t documents = documents_generation(config);
  if (last.counts.empty() || last.sizes != sizes || last.documents != documents) {
    std::optional<std::vector<HaloCounts>> swept;
    if (const PeriodicPieces* pieces = memo_periodic_pieces(config, cp, width, seq, documents))
      swept = extrapolated_counts(*pieces, members, config.window_left, *memo_period(config, cp, seq, documents));
    if (!swept)
      swept = swept_halo_counts(member_pieces(config, cp, width, seq), members, config.window_left, seq,
                                PartnerCount::cheapest, nullptr, &memo_rows(cp, seq, config.window_left, documents));
    if (!swept) return nullptr;
    last = {documents, sizes, std::move(*swept)};
  }
  return &last.counts;
}

}  // namespace

std::optional<std::vector<HaloCounts>> swept_halo_counts(const CpConfig& config, int cp, int width, std::int64_t seq,
                                                         PartnerCount how, SweepWork* work) {
  if (token_layout(config) != TokenLayout::per_document) return std::nullopt;
  return swept_halo_counts(pieces_of(config, cp, width, seq), cp / width, config.window_left, seq, how, work);
}

HaloCounts walked_halo_counts(int members, int me, const std::function<std::vector<SeqChunk>(int)>& chunks_of,
                              const AttentionParams& params) {
  // Neighbouring chunks belong to neighbouring members (contiguous and zigzag alike; a zigzag
  // member's mirror chunk is further away than its first one), so the gap to a member's chunks
  // grows with the distance to it: walk outwards on each side until a member exchanges nothing.
  // Per-document zigzag (documents given) interleaves the members at every document: ask all.
  const std::vector<SeqChunk> mine = chunks_of(me);
  const bool ask_all = !params.cu_seqlens.empty();
  HaloCounts h;
  for (int step : {-1, 1})
    for (int r = me + step; r >= 0 && r < members; r += step) {
      const std::vector<SeqChunk> theirs = chunks_of(r);
      const std::int64_t out = total_tokens(halo_rows(theirs, mine, params)),
                         in = total_tokens(halo_rows(mine, theirs, params));
      if (out == 0 && in == 0 && !ask_all) break;
      h.given += out;
      h.held += in;
      h.to += out > 0;
      h.back += in > 0;
    }
  return h;
}

HaloCounts halo_counts(const CpConfig& config, int cp, int width, int member, std::int64_t seq) {
  // The window from the config, not attention_params: that copies the documents' boundaries, a
  // member at a time (a million documents at cp 1024: 8 GB copied).
  const std::int64_t right = config.causal ? 0 : config.window_right;
  const std::optional<EvenRuns> e = even_runs(config, cp, width, seq);
  if (e && (!e->mirrored || right == 0)) return even_halo(*e, member, config.window_left, right);
  if (const auto swept = swept_members(config, cp, width, seq)) return (*swept)[std::size_t(member)];
  const auto chunks_of = [&](int g) {  // member g: the chunks of its `width` ranks
    std::vector<SeqChunk> c;
    for (int r = g * width; r < (g + 1) * width; ++r)
      for (const SeqChunk& x : rank_chunks(config, cp, r, seq)) c.push_back(x);
    return c;
  };
  return walked_halo_counts(cp / width, member, chunks_of, attention_params(config));
}

std::vector<HaloCounts> members_halo_counts(const CpConfig& config, int cp, int width, std::int64_t seq) {
  if (const auto* swept = swept_members(config, cp, width, seq)) return *swept;
  std::vector<HaloCounts> h;
  for (int m = 0; m < cp / width; ++m) h.push_back(halo_counts(config, cp, width, m, seq));
  return h;
}

void put_halo_key(Strategy::TrafficKey& key, std::size_t at, const HaloCounts& h) {
  for (const std::int64_t n : {h.given, h.held, h.to, h.back}) key.at(at++) = n;
}

HaloCounts halo_of(const Strategy::TrafficKey& key, std::size_t at) {
  return {key.at(at), key.at(at + 1), key.at(at + 2), key.at(at + 3)};
}

void add_halo_volume(CommVolume& v, const std::string& prefix, const HaloCounts& h, std::int64_t per_token,
                     std::int64_t es) {
  v.forward_bytes[prefix + "p2p_kv"] = h.given * per_token * es;
  v.backward_bytes[prefix + "p2p_dkv"] = h.held * per_token * 4;
  v.forward_messages[prefix + "p2p_kv"] = h.to;
  v.backward_messages[prefix + "p2p_dkv"] = h.back;
  for (const char* op : {"p2p_kv", "p2p_dkv"}) declare_transfer(v, prefix, op, Collective::ring);
}

}  // namespace ulysses
