#include "model/paths.h"

#include <cstdlib>

namespace lp {

std::string lazyprefill_home() {
  if (const char* h = std::getenv("LAZYPREFILL_HOME"); h && *h) return h;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/lazyprefill";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/lazyprefill";
}

std::string default_model_path() {
  return lazyprefill_home() + "/models/" + kDefaultModelFile;
}

}  // namespace lp
