// Minimal hand-written SVG, every plot the project draws: the canvas, the palette, axes and
// polylines (`ulysses plan --svg`, `ulysses train --svg`), and the benchmark's seed section's
// charts: line charts, bar groups, a per-rank timeline drawn from a Chrome trace.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace ulysses::svg {

// The opening of a w × h white canvas with `title` at the top left, from x = title_x; a plot
// ends with "</svg>\n".
std::string open(double w, double h, const std::string& title, double title_x = 10);
// Colour k of the palette (it repeats after nine).
const char* color(std::size_t k);
// Maps [lo, hi] (log10 when log) onto [a, b].
struct Axis {
  double lo, hi, a, b;
  bool log;
  double operator()(double v) const;
};
// A line through `points` ("x,y x,y ...").
std::string polyline(const std::string& points, const char* color, double width);

struct Series {
  std::string name;
  std::vector<double> x, y;  // points with y <= 0 are skipped (invalid configurations)
};
// Lines over x (log2 axis), y on a log10 axis when log_y.
std::string lines(const std::string& title, const std::string& x_label, const std::string& y_label,
                  const std::vector<Series>& series, bool log_y);

struct BarGroup {
  std::string name;            // under the group
  std::vector<double> values;  // one bar each (a rank)
};
std::string bars(const std::string& title, const std::string& y_label, const std::vector<BarGroup>& groups);

// One row per track (pid) of a Chrome trace's complete events, coloured by category;
// "phase" events as thin bars above their rank's row.
std::string timeline(const std::string& title, const nlohmann::json& trace);

}  // namespace ulysses::svg
