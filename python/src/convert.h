// Conversions the Python module's binding units share (module.cpp, calibrate.cpp): documents to and
// from Python objects, numpy arrays that own their data, and the CLI-shaped arguments (a string or
// a list of them, a model given as a file, a preset or a Model).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"

namespace lp::py {

namespace nb = nanobind;

// Python values to JSON and back through the json module: a dict passed in is read exactly as a
// file holding it would be (the one parser), and a document comes back as json.loads makes it.
nlohmann::ordered_json from_python(const nb::handle& v, const std::string& what);
nb::object to_python(const nlohmann::ordered_json& j);
nb::object to_python(const nlohmann::json& j);

// One or several strings (the CLI's repeated options); None: none.
std::vector<std::string> strings_from(const nb::handle& h, const char* what);

template <class T>
using Array = nb::ndarray<nb::numpy, const T>;

// A read-only numpy array that owns a copy of `v`, of the given shape (row-major). Made here, as an
// object: a property's getter would otherwise ask for reference_internal, which an array with its
// own owner refuses.
template <class T>
nb::object to_numpy(std::vector<T> v, std::vector<size_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::cast(Array<T>(owned->data(), shape.size(), shape.data(), owner), nb::rv_policy::automatic);
}
// The same, one-dimensional. (Not to_numpy(std::move(v), {v.size()}): the order the two arguments are
// evaluated in is the compiler's, and clang's moves `v` out before its size is read.)
template <class T>
nb::object to_numpy(std::vector<T> v) {
  const size_t n = v.size();
  return to_numpy(std::move(v), {n});
}

// The model argument of the simulator's functions: model_config is a preset name, a .json file or a
// Model; model a GGUF file. Every request has the three fields (model, model_config, config).
template <class Request>
void target_from(const std::optional<std::string>& model, const nb::handle& model_config, Request& r) {
  r.model = model.value_or("");
  if (model_config.is_none()) return;
  if (nb::isinstance<ModelConfig>(model_config))
    r.config = nb::cast<ModelConfig>(model_config);
  else if (nb::isinstance<nb::str>(model_config))
    r.model_config = nb::cast<std::string>(model_config);
  else
    throw nb::type_error("model_config: expected a preset name, a .json path or a Model");
}

// calibrate and calibrate_serving (calibrate.cpp).
void bind_calibrate(nb::module_& m);

}  // namespace lp::py
