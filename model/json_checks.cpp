// JSON nesting depth, checked before a parse (model/json_checks.h).
#include "model/json_checks.h"

namespace lp {

size_t json_too_deep(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character, a quote included, is not the string's end
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return i;
    } else if (c == ']' || c == '}') {
      --depth;  // unbalanced text is the parser's to refuse
    }
  }
  return std::string_view::npos;
}

}  // namespace lp
