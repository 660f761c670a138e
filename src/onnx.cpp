// SPDX-License-Identifier: BSD-3-Clause
// The compiled part of dpmlp::onnx: dpmlp::detail::onnx_export::Graph (plain host data) to an ONNX
// ModelProto, checked by ONNX's checker, serialized and written atomically. The graph it builds is the one
// dpmlp/onnx.hpp describes.
#include "dpmlp/detail/onnx_graph.hpp"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dpmlp/errors.hpp"
#include "dpmlp/version.hpp"

namespace dpmlp {
namespace detail {
namespace onnx_export {
namespace {

// IR version 7 with opset 13 (ONNX 1.8): every op used here has had its current semantics since then, and
// runtimes from that release on read the file. Pinned rather than taken from the ONNX headers in use, so the
// file does not change with the build machine's libonnx.
constexpr std::int64_t kIrVersion = 7;
constexpr std::int64_t kOpset = 13;

std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", v);
  return text;
}

// The float32 tensors of the graph, each value checked: finite in float32, and for a scale also positive
// there (a Div by a scale that rounded to zero would make inf).
class Tensors {
 public:
  Tensors(::onnx::GraphProto& graph, std::string where) : graph_(graph), where_(std::move(where)) {}

  void add(const std::string& name, const std::vector<std::int64_t>& dims, const double* values, std::size_t count,
           const std::string& what, bool positive = false) {
    ::onnx::TensorProto* t = graph_.add_initializer();
    t->set_name(name);
    t->set_data_type(::onnx::TensorProto::FLOAT);
    for (std::int64_t d : dims) t->add_dims(d);
    // raw_data: little-endian float32, as the ONNX spec fixes it for raw_data whatever the host.
    std::string raw(count * 4, '\0');
    for (std::size_t i = 0; i < count; ++i) {
      const float f = static_cast<float>(values[i]);
      if (!std::isfinite(f) || (positive && !(f > 0.0f))) {
        throw InputError(where_ + ": " + what + " [" + std::to_string(i) + "] is " + number(values[i]) + ": " +
                         (std::isfinite(f) ? "a scale must be positive" : "not finite") +
                         " in float32, the ONNX graph's type");
      }
      std::uint32_t bits = 0;
      std::memcpy(&bits, &f, 4);
      for (int b = 0; b < 4; ++b) raw[4 * i + b] = static_cast<char>((bits >> (8 * b)) & 0xffu);
    }
    t->set_raw_data(raw);
  }

 private:
  ::onnx::GraphProto& graph_;
  std::string where_;
};

::onnx::NodeProto* add_node(::onnx::GraphProto& graph, const std::string& op, const std::string& name,
                            const std::vector<std::string>& inputs, const std::string& output) {
  ::onnx::NodeProto* n = graph.add_node();
  n->set_op_type(op);
  n->set_name(name);
  for (const auto& i : inputs) n->add_input(i);
  n->add_output(output);
  return n;
}

// A float32 [N, columns] value: the graph's input or output.
void describe(::onnx::ValueInfoProto* v, const std::string& name, int columns) {
  v->set_name(name);
  ::onnx::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(::onnx::TensorProto::FLOAT);
  ::onnx::TensorShapeProto* s = t->mutable_shape();
  s->add_dim()->set_dim_param("N");
  s->add_dim()->set_dim_value(columns);
}

void set_metadata(::onnx::ModelProto& model, const std::string& key, const std::string& value) {
  ::onnx::StringStringEntryProto* e = model.add_metadata_props();
  e->set_key(key);
  e->set_value(value);
}

std::string widths_text(const std::vector<int>& w) {
  std::string s;
  for (std::size_t i = 0; i < w.size(); ++i) s += (i ? "-" : "") + std::to_string(w[i]);
  return s;
}

::onnx::ModelProto build(const Graph& g, const std::string& where) {
  const std::vector<int>& w = g.widths;
  if (w.size() < 2) throw InputError(where + ": the model needs at least {inputs, outputs} widths");
  std::size_t expected = 0;
  for (std::size_t l = 0; l + 1 < w.size(); ++l) {
    if (w[l] <= 0 || w[l + 1] <= 0) throw InputError(where + ": widths must be positive");
    expected += std::size_t(w[l]) * std::size_t(w[l + 1]) + std::size_t(w[l + 1]);
  }
  if (g.params.size() != expected) {
    throw InputError(where + ": " + std::to_string(g.params.size()) + " parameters for widths " + widths_text(w) +
                     ", which have " + std::to_string(expected));
  }
  const char* act_op = g.activation == "relu" ? "Relu" : g.activation == "tanh" ? "Tanh" : nullptr;
  if (!act_op && g.activation != "identity") {
    throw InputError(where + ": activation '" + g.activation + "' has no ONNX operator here (relu, tanh, identity)");
  }
  const int inputs = w.front(), outputs = w.back(), layers = static_cast<int>(w.size()) - 1;
  auto check_columns = [&](bool has, const std::vector<double>& mean, const std::vector<double>& scale, int columns,
                           const char* which) {
    if (has && (mean.size() != std::size_t(columns) || scale.size() != std::size_t(columns))) {
      throw InputError(where + ": the " + std::string(which) + " standardization has " + std::to_string(mean.size()) +
                       " means and " + std::to_string(scale.size()) + " scales; the model has " +
                       std::to_string(columns) + " columns there");
    }
  };
  check_columns(g.has_x, g.x_mean, g.x_scale, inputs, "input");
  check_columns(g.has_y, g.y_mean, g.y_scale, outputs, "output");

  ::onnx::ModelProto model;
  model.set_ir_version(kIrVersion);
  model.set_producer_name("dpmlp");
  model.set_producer_version(DPMLP_VERSION_STRING);
  model.set_model_version(1);
  model.set_doc_string("dpmlp MLP " + widths_text(w) + ", hidden activation " + g.activation +
                       (g.has_x ? ", input standardization (x - x_mean) / x_scale" : "") +
                       (g.has_y ? ", output standardization y * y_scale + y_mean" : ""));
  ::onnx::OperatorSetIdProto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOpset);
  set_metadata(model, "dpmlp.widths", widths_text(w));
  set_metadata(model, "dpmlp.activation", g.activation);
  set_metadata(model, "dpmlp.input_standardization", g.has_x ? "true" : "false");
  set_metadata(model, "dpmlp.output_standardization", g.has_y ? "true" : "false");

  ::onnx::GraphProto& graph = *model.mutable_graph();
  graph.set_name("dpmlp_mlp");
  describe(graph.add_input(), "x", inputs);
  describe(graph.add_output(), "y", outputs);
  Tensors tensors(graph, where);

  std::string h = "x";  // the value that flows from node to node
  if (g.has_x) {
    tensors.add("x_mean", {inputs}, g.x_mean.data(), g.x_mean.size(), "the input standardization's mean");
    tensors.add("x_scale", {inputs}, g.x_scale.data(), g.x_scale.size(), "the input standardization's scale", true);
    add_node(graph, "Sub", "x_center", {"x", "x_mean"}, "x_centered");
    add_node(graph, "Div", "x_standardize", {"x_centered", "x_scale"}, "x_standardized");
    h = "x_standardized";
  }
  std::size_t offset = 0;
  for (int l = 0; l < layers; ++l) {
    const std::string L = std::to_string(l);
    const std::size_t n_in = std::size_t(w[l]), n_out = std::size_t(w[l + 1]);
    tensors.add("W" + L, {w[l], w[l + 1]}, g.params.data() + offset, n_in * n_out, "layer " + L + "'s weight");
    offset += n_in * n_out;
    tensors.add("b" + L, {w[l + 1]}, g.params.data() + offset, n_out, "layer " + L + "'s bias");
    offset += n_out;
    const bool last = l + 1 == layers;
    const std::string z = last && !g.has_y ? "y" : "z" + L;
    add_node(graph, "Gemm", "dense" + L, {h, "W" + L, "b" + L}, z);  // alpha = beta = 1, no transposes
    h = z;
    if (!last && act_op) {
      const std::string a = "h" + L;
      add_node(graph, act_op, g.activation + L, {z}, a);
      h = a;
    }
  }
  if (g.has_y) {
    tensors.add("y_scale", {outputs}, g.y_scale.data(), g.y_scale.size(), "the output standardization's scale", true);
    tensors.add("y_mean", {outputs}, g.y_mean.data(), g.y_mean.size(), "the output standardization's mean");
    add_node(graph, "Mul", "y_scale_up", {h, "y_scale"}, "y_scaled");
    add_node(graph, "Add", "y_shift", {"y_scaled", "y_mean"}, "y");
  }
  return model;
}

std::string errno_text(int code) { return std::strerror(code); }

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};

}  // namespace

namespace {
// serialize(), with messages that start with `where`.
std::string serialize_for(const Graph& graph, const std::string& where) {
  GOOGLE_PROTOBUF_VERIFY_VERSION;
  const ::onnx::ModelProto model = build(graph, where);
  // A single protobuf message holds at most 2 GiB; ONNX's external-data files are not written here.
  const std::size_t bytes = model.ByteSizeLong();
  if (bytes > static_cast<std::size_t>(INT_MAX)) {
    throw InputError(where + ": the model takes " + std::to_string(bytes) +
                     " bytes, more than the 2 GiB an ONNX file holds without external data");
  }
  try {
    ::onnx::checker::check_model(model);
  } catch (const std::exception& e) {
    // The graph is built from checked values; a checker failure is dpmlp's bug, not the caller's input.
    throw Error(where + ": ONNX's checker refused the graph dpmlp built: " + e.what());
  }
  std::string out;
  if (!model.SerializeToString(&out)) throw Error(where + ": protobuf could not serialize the model");
  return out;
}
}  // namespace

std::string serialize(const Graph& graph) { return serialize_for(graph, "dpmlp::save_onnx"); }

void write(const Graph& graph, const std::string& path) {
  const std::string who = "dpmlp::save_onnx";
  if (path.empty()) throw InputError(who + ": the path is empty");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    throw InputError(who + ": " + path + " is a directory; give the path of the .onnx file to write");
  }
  const std::string bytes = serialize_for(graph, who + ": " + path);
  const std::string tmp = path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  {
    std::unique_ptr<std::FILE, FileCloser> f(std::fopen(tmp.c_str(), "wb"));
    if (!f) {
      const int code = errno;
      throw InputError(who + ": " + path + ": cannot create '" + tmp + "': " + errno_text(code));
    }
    bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f.get()) == bytes.size();
    ok = std::fflush(f.get()) == 0 && ok;
    const int code = errno;
    if (!ok) {
      f.reset();
      std::remove(tmp.c_str());
      throw InputError(who + ": " + path + ": write failed: " + errno_text(code));
    }
    if (std::fclose(f.release()) != 0) {
      const int close_code = errno;
      std::remove(tmp.c_str());
      throw InputError(who + ": " + path + ": write failed: " + errno_text(close_code));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int code = errno;
    std::remove(tmp.c_str());
    throw InputError(who + ": " + path + ": cannot rename '" + tmp + "' to it: " + errno_text(code));
  }
}

}  // namespace onnx_export
}  // namespace detail
}  // namespace dpmlp
