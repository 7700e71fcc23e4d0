#include "tools/loadtest/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

namespace baton::loadtest {
namespace {

constexpr double kPanelWidth = 330, kPanelHeight = 290;
constexpr double kPanelLeft = 80, kPanelGap = 420, kPanelTop = 110;
constexpr double kWidth = kPanelLeft + 2 * kPanelGap + kPanelWidth + 40;
constexpr double kHeight = kPanelTop + kPanelHeight + 70;
constexpr int kTargetTicks = 5;
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                   "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
constexpr const char* kDashed = "6,4";

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", value);
  return text;
}

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

// A tick step of 1, 2 or 5 times a power of ten giving about kTargetTicks ticks.
double nice_step(double range) {
  if (!(range > 0)) return 1;
  const double raw = range / kTargetTicks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10 * power;
}

std::string text(double x, double y, const std::string& content, const std::string& extra = "") {
  return "<text x=\"" + number(x) + "\" y=\"" + number(y) + "\" " + extra + ">" + escape(content) +
         "</text>\n";
}

std::string line(double x1, double y1, double x2, double y2, const std::string& style) {
  return "<line x1=\"" + number(x1) + "\" y1=\"" + number(y1) + "\" x2=\"" + number(x2) +
         "\" y2=\"" + number(y2) + "\" " + style + "/>\n";
}

struct Curve {
  const char* color;
  bool dashed;
  std::vector<std::pair<double, double>> points;  // (rate, value)
};

// One panel: axes from 0 to the largest rate and value, ticks, the curves.
std::string panel(int index, const std::string& title, const std::string& y_label,
                  const std::vector<Curve>& curves) {
  double max_x = 0, max_y = 0;
  for (const Curve& c : curves) {
    for (auto [x, y] : c.points) {
      max_x = std::max(max_x, x);
      max_y = std::max(max_y, y);
    }
  }
  const double step_x = nice_step(max_x), step_y = nice_step(max_y);
  const double top_x = std::max(step_x, std::ceil(max_x / step_x) * step_x);
  const double top_y = std::max(step_y, std::ceil(max_y / step_y) * step_y);
  const double left = kPanelLeft + index * kPanelGap, bottom = kPanelTop + kPanelHeight;
  auto px = [&](double x) { return left + x / top_x * kPanelWidth; };
  auto py = [&](double y) { return bottom - y / top_y * kPanelHeight; };
  std::string svg = text(left + kPanelWidth / 2, kPanelTop - 12, title,
                         "text-anchor=\"middle\" font-weight=\"bold\"");
  const std::string grid = "stroke=\"#e0e0e0\"", axis = "stroke=\"#333\"";
  for (double y = 0; y <= top_y * (1 + 1e-9); y += step_y) {
    svg += line(left, py(y), left + kPanelWidth, py(y), grid);
    svg += text(left - 6, py(y) + 4, number(y), "text-anchor=\"end\" font-size=\"11\"");
  }
  for (double x = 0; x <= top_x * (1 + 1e-9); x += step_x) {
    svg += line(px(x), bottom, px(x), bottom + 4, axis);
    svg += text(px(x), bottom + 17, number(x), "text-anchor=\"middle\" font-size=\"11\"");
  }
  svg += line(left, bottom, left + kPanelWidth, bottom, axis);
  svg += line(left, kPanelTop, left, bottom, axis);
  svg +=
      text(left + kPanelWidth / 2, bottom + 38, "request rate (req/s)", "text-anchor=\"middle\"");
  svg += text(left - 55, kPanelTop + kPanelHeight / 2, y_label,
              "text-anchor=\"middle\" transform=\"rotate(-90 " + number(left - 55) + " " +
                  number(kPanelTop + kPanelHeight / 2) + ")\"");
  for (const Curve& c : curves) {
    std::string points;
    for (auto [x, y] : c.points) points += number(px(x)) + "," + number(py(y)) + " ";
    svg += "<polyline fill=\"none\" stroke=\"" + std::string(c.color) +
           "\" stroke-width=\"2\" points=\"" + points + "\"" +
           (c.dashed ? " stroke-dasharray=\"" + std::string(kDashed) + "\"" : "") + "/>\n";
    for (auto [x, y] : c.points) {
      svg += "<circle cx=\"" + number(px(x)) + "\" cy=\"" + number(py(y)) + "\" r=\"3\" fill=\"" +
             c.color + "\"/>\n";
    }
  }
  return svg;
}

// The median and P99 curves of one metric, for every series.
std::vector<Curve> percentile_curves(const std::vector<SweepSeries>& series,
                                     double SweepPoint::*median, double SweepPoint::*p99) {
  std::vector<Curve> curves;
  for (size_t i = 0; i < series.size(); ++i) {
    const char* color = kColors[i % std::size(kColors)];
    Curve solid{color, false, {}}, dashed{color, true, {}};
    for (const SweepPoint& p : series[i].points) {
      solid.points.push_back({p.request_rate, p.*median});
      dashed.points.push_back({p.request_rate, p.*p99});
    }
    curves.push_back(std::move(solid));
    curves.push_back(std::move(dashed));
  }
  return curves;
}

std::string legend(const std::vector<SweepSeries>& series) {
  std::string svg;
  double x = kPanelLeft;
  const double y = 70;
  for (size_t i = 0; i < series.size(); ++i) {
    const std::string color = kColors[i % std::size(kColors)];
    svg += line(x, y, x + 28, y, "stroke=\"" + color + "\" stroke-width=\"3\"");
    svg += text(x + 34, y + 4, series[i].label);
    x += 60 + 8 * double(series[i].label.size());
  }
  svg += line(x + 20, y, x + 48, y, "stroke=\"#333\" stroke-width=\"2\"");
  svg += text(x + 54, y + 4, "median");
  svg +=
      line(x + 120, y, x + 148, y,
           "stroke=\"#333\" stroke-width=\"2\" stroke-dasharray=\"" + std::string(kDashed) + "\"");
  svg += text(x + 154, y + 4, "P99");
  return svg;
}

}  // namespace

std::string sweep_chart_svg(const std::vector<SweepSeries>& series, const std::string& title,
                            const std::string& subtitle) {
  bool goodput = false;
  for (const SweepSeries& s : series) {
    for (const SweepPoint& p : s.points) goodput = goodput || p.request_goodput.has_value();
  }
  std::vector<Curve> rate_curves;
  for (size_t i = 0; i < series.size(); ++i) {
    Curve curve{kColors[i % std::size(kColors)], false, {}};
    for (const SweepPoint& p : series[i].points) {
      curve.points.push_back(
          {p.request_rate, goodput ? p.request_goodput.value_or(0.0) : p.request_throughput});
    }
    rate_curves.push_back(std::move(curve));
  }
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + number(kWidth) +
                    "\" height=\"" + number(kHeight) + "\" viewBox=\"0 0 " + number(kWidth) + " " +
                    number(kHeight) + "\" font-family=\"sans-serif\" font-size=\"13\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg +=
      text(kWidth / 2, 26, title, "text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\"");
  if (!subtitle.empty())
    svg += text(kWidth / 2, 44, subtitle, "text-anchor=\"middle\" fill=\"#555\"");
  svg += legend(series);
  svg += panel(0, "Time to first token", "TTFT (ms)",
               percentile_curves(series, &SweepPoint::median_ttft_ms, &SweepPoint::p99_ttft_ms));
  svg += panel(1, "Time per output token", "TPOT (ms)",
               percentile_curves(series, &SweepPoint::median_tpot_ms, &SweepPoint::p99_tpot_ms));
  svg += panel(2, goodput ? "Goodput" : "Request throughput",
               goodput ? "goodput (req/s)" : "throughput (req/s)", rate_curves);
  svg += "</svg>\n";
  return svg;
}

}  // namespace baton::loadtest
