// The loss curve as a standalone SVG (loss.svg beside log.csv).
#include <cmath>
#include <sstream>

#include "sinter/io.h"
#include "sinter/train.h"

namespace sinter::train {

void write_loss_svg(const std::string& path, const std::vector<std::array<double, 3>>& rows) {
  const double W = 640, H = 400, L = 60, R = 20, T = 30, B = 50;
  double x1 = 1, ymin = 1e30, ymax = -1e30;
  for (auto& r : rows) {
    x1 = std::max(x1, r[0]);
    for (int k = 1; k < 3; ++k)
      if (std::isfinite(r[size_t(k)])) { ymin = std::min(ymin, r[size_t(k)]); ymax = std::max(ymax, r[size_t(k)]); }
  }
  if (ymin > ymax) { ymin = 0; ymax = 1; }
  if (ymax - ymin < 1e-6) ymax = ymin + 1;
  auto px = [&](double x) { return L + (W - L - R) * x / x1; };
  auto py = [&](double y) { return T + (H - T - B) * (1 - (y - ymin) / (ymax - ymin)); };
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
     << "<text x=\"" << W / 2 << "\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">loss (nats per byte)</text>\n"
     << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - R << "\" y2=\"" << H - B << "\" stroke=\"black\"/>\n"
     << "<line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << H - B << "\" stroke=\"black\"/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double y = ymin + (ymax - ymin) * i / 4, x = x1 * i / 4;
    os << "<text x=\"" << L - 6 << "\" y=\"" << py(y) + 4 << "\" text-anchor=\"end\">" << std::to_string(y).substr(0, 4) << "</text>\n"
       << "<line x1=\"" << L << "\" y1=\"" << py(y) << "\" x2=\"" << W - R << "\" y2=\"" << py(y) << "\" stroke=\"#ddd\"/>\n"
       << "<text x=\"" << px(x) << "\" y=\"" << H - B + 18 << "\" text-anchor=\"middle\">" << int64_t(x) << "</text>\n";
  }
  os << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 10 << "\" text-anchor=\"middle\">step</text>\n";
  const char* colors[3] = {"", "#1f77b4", "#ff7f0e"};
  const char* names[3] = {"", "train", "validation"};
  for (int k = 1; k < 3; ++k) {
    os << "<polyline fill=\"none\" stroke=\"" << colors[k] << "\" stroke-width=\"" << (k == 2 ? 2 : 1.2) << "\" points=\"";
    for (auto& r : rows)
      if (std::isfinite(r[size_t(k)])) os << px(r[0]) << "," << py(r[size_t(k)]) << " ";
    os << "\"/>\n<text x=\"" << W - R - 90 << "\" y=\"" << T + 16 * k << "\" fill=\"" << colors[k] << "\">" << names[k] << "</text>\n";
  }
  os << "</svg>\n";
  io::atomic_write(path, os.str());
}

}  // namespace sinter::train
