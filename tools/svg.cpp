#include "svg.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace ulysses::svg {

namespace {
constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"};
}  // namespace

std::string open(double w, double h, const std::string& title, double title_x) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"22\" font-size=\"14\">{}</text>\n",
      w, h, title_x, title);
}

const char* color(std::size_t k) { return kColors[k % std::size(kColors)]; }

double Axis::operator()(double v) const {
  const double t = log ? (std::log10(v) - std::log10(lo)) / std::max(1e-12, std::log10(hi) - std::log10(lo))
                       : (v - lo) / std::max(1e-300, hi - lo);
  return a + (b - a) * t;
}

std::string polyline(const std::string& points, const char* color, double width) {
  return fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" points=\"{}\"/>\n", color, width,
                     points);
}

std::string lines(const std::string& title, const std::string& x_label, const std::string& y_label,
                  const std::vector<Series>& series, bool log_y) {
  double xlo = 1e300, xhi = 0, ylo = 1e300, yhi = 0;
  for (const Series& s : series)
    for (std::size_t i = 0; i < s.x.size(); ++i)
      if (s.y[i] > 0)
        xlo = std::min(xlo, s.x[i]), xhi = std::max(xhi, s.x[i]), ylo = std::min(ylo, s.y[i]),
        yhi = std::max(yhi, s.y[i]);
  if (!log_y) ylo = 0;
  const double W = 760, H = 440, L = 80, R = 230, T = 40, B = 50;
  const Axis X{xlo, xhi, L, W - R, true}, Y{ylo, yhi * (log_y ? 1.0 : 1.05), H - B, T, log_y};
  std::string svg = open(W, H, title);
  for (double x = xlo; x <= xhi * 1.0001; x *= 2)
    svg += fmt::format("<text x=\"{:.0f}\" y=\"{}\" text-anchor=\"middle\">{:g}</text>\n", X(x), H - B + 16, x);
  svg += fmt::format("<text x=\"{:.0f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", (L + W - R) / 2, H - 8, x_label);
  for (double y : {ylo > 0 ? ylo : Y.hi / 2, Y.hi})
    svg += fmt::format("<text x=\"{}\" y=\"{:.0f}\" text-anchor=\"end\">{:.3g}</text>\n", L - 4, Y(y) + 4, y);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", L - 4, T - 8, y_label);
  for (std::size_t k = 0; k < series.size(); ++k) {
    std::string pts;
    for (std::size_t i = 0; i < series[k].x.size(); ++i)
      if (series[k].y[i] > 0) pts += fmt::format("{:.1f},{:.1f} ", X(series[k].x[i]), Y(series[k].y[i]));
    const char* c = color(k);
    svg += polyline(pts, c, 1.8);
    svg += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>\n", W - R + 10, T + 16 * double(k), c,
                       series[k].name);
  }
  return svg + "</svg>\n";
}

std::string bars(const std::string& title, const std::string& y_label, const std::vector<BarGroup>& groups) {
  double hi = 0;
  std::size_t bars = 0;
  for (const BarGroup& g : groups) {
    bars += g.values.size() + 1;
    for (double v : g.values) hi = std::max(hi, v);
  }
  const double W = std::max(600.0, 14.0 * double(bars) + 120), H = 420, L = 70, T = 40, B = 70;
  const double bw = (W - L - 20) / double(std::max<std::size_t>(1, bars));
  const Axis Y{0, hi * 1.05, H - B, T, false};
  std::string svg = open(W, H, title);
  svg += fmt::format(
      "<text x=\"{}\" y=\"{:.0f}\" text-anchor=\"end\">{:.3g}</text>\n<text x=\"{}\" y=\"{}\" "
      "text-anchor=\"end\">0</text>\n<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
      L - 4, Y(hi) + 4, hi, L - 4, H - B, L - 4, T - 8, y_label);
  double x = L;
  for (const BarGroup& g : groups) {
    for (std::size_t r = 0; r < g.values.size(); ++r, x += bw)
      svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>\n", x,
                         Y(g.values[r]), bw * 0.9, H - B - Y(g.values[r]), color(r));
    const double left = x - bw * double(g.values.size());
    svg +=
        fmt::format("<text x=\"{0:.1f}\" y=\"{1}\" font-size=\"10\" transform=\"rotate(30 {0:.1f} {1})\">{2}</text>\n",
                    left, H - B + 14, g.name);
    x += bw;
  }
  return svg + "</svg>\n";
}

std::string timeline(const std::string& title, const nlohmann::json& trace) {
  double end = 0;
  int tracks = 0;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X") {
      end = std::max(end, double(e["ts"]) + double(e["dur"]));
      tracks = std::max(tracks, int(e["pid"]) + 1);
    }
  const std::map<std::string, const char*> colors{{"compute", "#2ca02c"},
                                                  {"comm", "#1f77b4"},
                                                  {"wait", "#d62728"},
                                                  {"phase", "#bbbbbb"}};
  const double W = 1000, row = 46, L = 60, T = 40, H = T + row * tracks + 40;
  const Axis X{0, std::max(end, 1.0), L, W - 10, false};
  std::string svg = open(W, H, title);
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::string cat = e["cat"];
    const bool phase = cat == "phase";
    const double y = T + row * double(e["pid"]) + (phase ? 0 : 8), h = phase ? 5 : 30;
    const double x0 = X(double(e["ts"])), x1 = X(double(e["ts"]) + double(e["dur"]));
    svg += fmt::format(
        "<rect x=\"{:.2f}\" y=\"{:.0f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\"><title>{} {:.3f} ms"
        "</title></rect>\n",
        x0, y, std::max(0.3, x1 - x0), h, colors.count(cat) ? colors.at(cat) : "#999999", std::string(e["name"]),
        double(e["dur"]) / 1e3);
  }
  for (int r = 0; r < tracks; ++r)
    svg += fmt::format("<text x=\"4\" y=\"{:.0f}\">rank {}</text>\n", T + row * r + 28, r);
  svg += fmt::format(
      "<text x=\"{}\" y=\"{:.0f}\">0 … {:.1f} ms; green compute, blue communication call, red "
      "blocked waiting for a transfer, grey forward/backward</text>\n",
      L, H - 14, end / 1e3);
  return svg + "</svg>\n";
}

}  // namespace ulysses::svg
