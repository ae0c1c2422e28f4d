// Export: the graph an OnnxModelT was loaded from, unchanged, with each
// initializer rebuilt from the parameters that came from it (their elements
// put back where they were read from) in its original type, checked by ONNX's
// checker and written through the one checked path for output files
// (engine/files.hpp: never over what is not a regular file, a scratch file
// created exclusively beside it, renamed into place once synced).
#include <cstring>
#include <stdexcept>

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include "engine/files.hpp"
#include "onnx/program.hpp"

namespace dpgrad::onnx {

template <class T>
void save(const ModelT<T>& model, const std::string& path) {
  const auto* m = dynamic_cast<const OnnxModelT<T>*>(&model);
  if (!m) throw OnnxError("save: model '" + model.name() + "' was not loaded from ONNX; only imported models export");
  const detail::Program& p = m->program();
  ::onnx::ModelProto out = *p.proto;
  const std::vector<ArrayT<T>> values = m->all_values();
  // each initializer's elements: the file's, overwritten by its parameters' current values
  std::vector<std::vector<double>> data(p.initializers.size());
  std::vector<bool> touched(p.initializers.size(), false);
  for (std::size_t k = 0; k < p.params.size(); ++k) {
    const detail::ParamSpec& spec = p.params[k];
    const std::size_t i = std::size_t(spec.initializer);
    if (!touched[i]) {
      data[i].assign(p.initializers[i].values->begin(), p.initializers[i].values->end());
      touched[i] = true;
    }
    const ArrayT<T>& v = values[k];
    for (std::size_t e = 0; e < v.size(); ++e) data[i][spec.source.empty() ? e : spec.source[e]] = double(v.data()[e]);
  }
  auto* inits = out.mutable_graph()->mutable_initializer();
  for (int j = 0; j < inits->size(); ++j) {
    const std::size_t i = std::size_t(j);
    if (i >= touched.size() || !touched[i]) continue;
    ::onnx::TensorProto& t = (*inits)[j];
    if (t.name() != p.initializers[i].name) throw std::logic_error("save: initializers out of order");
    std::string raw;
    if (t.data_type() == 1) {  // FLOAT; else DOUBLE
      raw.resize(data[i].size() * 4);
      for (std::size_t e = 0; e < data[i].size(); ++e) {
        const float f = float(data[i][e]);
        std::memcpy(raw.data() + 4 * e, &f, 4);
      }
    } else {
      raw.resize(data[i].size() * 8);
      std::memcpy(raw.data(), data[i].data(), raw.size());
    }
    t.clear_float_data();
    t.clear_double_data();
    t.set_raw_data(std::move(raw));
  }
  try {
    ::onnx::checker::check_model(out);
  } catch (const std::exception& e) {
    throw OnnxError("save: ONNX's checker refuses the exported model: " + std::string(e.what()));
  }
  std::string bytes;
  if (!out.SerializeToString(&bytes)) throw std::runtime_error("save: cannot serialise the model for " + path);
  write_output_file(path, bytes, "onnx::save");
}

template <class T>
std::string save_problem(const ModelT<T>& model) {
  if (dynamic_cast<const OnnxModelT<T>*>(&model)) return "";
  return "model '" + model.name() + "' was not loaded from ONNX; only imported models export";
}

template std::string save_problem(const ModelT<float>&);
template std::string save_problem(const ModelT<double>&);
template void save(const ModelT<float>&, const std::string&);
template void save(const ModelT<double>&, const std::string&);

}  // namespace dpgrad::onnx
