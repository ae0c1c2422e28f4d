// Module names for initializers an exporter renamed (docs/onnx.md, "Parameter
// names"): `onnx::MatMul_134` takes its bias's name or its node's module path
// ("/enc/layers.0/self_attn/MatMul"); an RNN node gives its module and layer.
#include <algorithm>
#include <unordered_map>

#include "onnx/compiler.hpp"

namespace dpgrad::onnx::detail {

namespace {

/// "/enc/layers.0/self_attn/MatMul" -> "enc.layers.0.self_attn"; "" without a path.
std::string module_of(const std::string& node_name) {
  if (node_name.empty() || node_name[0] != '/') return "";
  const std::size_t last = node_name.rfind('/');
  if (last == 0) return "";
  std::string m = node_name.substr(1, last - 1);
  std::replace(m.begin(), m.end(), '/', '.');
  return m;
}

bool renamed(const std::string& name) { return name.rfind("onnx::", 0) == 0 || name.empty(); }

}  // namespace

std::map<std::string, std::string> recover_names(const Graph& g) {
  std::unordered_map<std::string, std::vector<std::pair<const Node*, std::size_t>>> readers;
  for (const auto& n : g.nodes)
    for (std::size_t k = 0; k < n.inputs.size(); ++k)
      if (!n.inputs[k].empty()) readers[n.inputs[k]].push_back({&n, k});
  std::map<std::string, std::string> names;
  for (const auto& t : g.initializers) {
    if (!renamed(t.name)) continue;
    const auto it = readers.find(t.name);
    if (it == readers.end() || it->second.empty()) continue;
    const auto [n, k] = it->second.front();
    const std::string module = module_of(n->name);
    std::string name;
    if (n->op == "MatMul" && k == 1 && !n->outputs.empty()) {
      // a bias added right after: "X.bias" gives "X.weight", "X_bias" gives "X_weight"
      const auto r = readers.find(n->outputs[0]);
      if (r != readers.end() && r->second.size() == 1 && r->second[0].first->op == "Add") {
        const Node* add = r->second[0].first;
        const std::string& other = add->inputs[1 - r->second[0].second];
        const std::size_t at = other.rfind("bias");
        if (!renamed(other) && at != std::string::npos && at + 4 == other.size() && at > 0)
          name = other.substr(0, at) + "weight";
      }
      if (name.empty() && !module.empty()) name = module + ".weight";
    } else if ((n->op == "Gemm" || n->op == "Conv") && (k == 1 || k == 2) && !module.empty()) {
      name = module + (k == 1 ? ".weight" : ".bias");
    } else if ((n->op == "LSTM" || n->op == "GRU") && !module.empty()) {
      name = module + (k == 1 ? ".W" : k == 2 ? ".R" : ".B");  // the per-direction names come from the node
    }
    if (!name.empty()) names[t.name] = name;
  }
  // an RNN node: its module and its layer among the RNN nodes of that module
  std::map<std::string, int> layers;
  for (const auto& n : g.nodes)
    if (n.op == "LSTM" || n.op == "GRU") {
      const std::string module = module_of(n.name);
      if (module.empty()) continue;
      names["@rnn:" + n.name] = module + "|" + std::to_string(layers[module]++);
    }
  // a recovered name that collides with an initializer's own, or with another: keep the file's
  std::map<std::string, int> count;
  for (const auto& t : g.initializers) ++count[t.name];
  for (const auto& [k, v] : names)
    if (k.rfind("@rnn:", 0) != 0) ++count[v];
  for (auto it = names.begin(); it != names.end();) {
    if (it->first.rfind("@rnn:", 0) != 0 && count[it->second] > 1) it = names.erase(it);
    else ++it;
  }
  return names;
}

}  // namespace dpgrad::onnx::detail
