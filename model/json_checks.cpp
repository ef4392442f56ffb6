// JSON nesting depth, checked before a parse (model/json_checks.h).
#include "model/json_checks.h"

#include <vector>

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

namespace {

// Follows the parse's position as a path; stops at the first error, keeping the path there.
class PathTracker : public nlohmann::json_sax<nlohmann::json> {
 public:
  std::string path;  // where the parse failed

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    levels_.push_back({true, {}, 0});
    return true;
  }
  bool key(string_t& k) override {
    levels_.back().key = k;
    return true;
  }
  bool end_object() override { return end(); }
  bool start_array(std::size_t) override {
    levels_.push_back({false, {}, 0});
    return true;
  }
  bool end_array() override { return end(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    for (const Level& l : levels_) {
      if (l.object) {
        if (!l.key) break;  // between members: the error is the object's own
        path += (path.empty() ? "" : ".") + *l.key;
      } else {
        path += fmt::format("[{}]", l.index);
      }
    }
    return false;
  }

 private:
  struct Level {
    bool object;
    std::optional<std::string> key;  // the member being read (objects)
    int64_t index;                   // the element being read (arrays)
  };
  std::vector<Level> levels_;

  bool value() {  // a value ended: the next one is another member or element
    if (!levels_.empty()) {
      if (levels_.back().object)
        levels_.back().key.reset();
      else
        ++levels_.back().index;
    }
    return true;
  }
  bool end() {
    levels_.pop_back();
    return value();
  }
};

}  // namespace

std::string json_error_path(std::string_view text) {
  PathTracker t;
  nlohmann::json::sax_parse(text, &t);
  return t.path;
}

}  // namespace lp
