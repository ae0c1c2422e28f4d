// Tape recording, the reverse sweep, and apply(): the one place where an op's
// primal, jvp and recording are sequenced.
#include "engine/tape.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/runtime.hpp"

namespace dpgrad {

namespace {
template <class T>
TapeT<T>*& active_tape_slot() {
  thread_local TapeT<T>* tape = nullptr;
  return tape;
}

}  // namespace

template <class T>
TapeT<T>* active_tape() {
  return active_tape_slot<T>();
}

template <class T>
RecordScope<T>::RecordScope(TapeT<T>& tape) : previous_(active_tape_slot<T>()) {
  active_tape_slot<T>() = &tape;
}
template <class T>
RecordScope<T>::~RecordScope() {
  active_tape_slot<T>() = previous_;
}
template <class T>
NoRecordScope<T>::NoRecordScope() : previous_(active_tape_slot<T>()) {
  active_tape_slot<T>() = nullptr;
}
template <class T>
NoRecordScope<T>::~NoRecordScope() {
  active_tape_slot<T>() = previous_;
}

template <class T>
void TapeT<T>::record(std::unique_ptr<Op<T>> op, std::vector<std::shared_ptr<Node<T>>> inputs,
                      std::shared_ptr<Node<T>> output) {
  const char* name = op->name();
  entries_.push_back(Entry{std::move(op), std::move(inputs), std::move(output), name});
  Entry& e = entries_.back();
  e.op->on_record(*this, std::span<const std::shared_ptr<Node<T>>>(e.inputs));
}

template <class T>
ParamUse<T>* TapeT<T>::add_use(const std::shared_ptr<Node<T>>& param, UseKind kind) {
  use_store_.push_back(ParamUse<T>{});  // every field at its default, then the kind
  use_store_.back().kind = kind;
  ParamUse<T>* use = &use_store_.back();
  auto it = group_of_.find(param.get());
  if (it == group_of_.end()) {
    group_of_.emplace(param.get(), grouped_.size());
    grouped_.push_back(ParamUses<T>{param, {use}});
    group_first_entry_.push_back(entries_.empty() ? 0 : entries_.size() - 1);  // uses are noted by on_record
  } else {
    grouped_[it->second].uses.push_back(use);
  }
  return use;
}

template <class T>
void TapeT<T>::backward(const TensorT<T>& loss) {
  if (!loss.defined() || loss.size() != 1)
    throw std::invalid_argument("backward(loss): loss must have one element, got shape " +
                                shape_str(loss.shape()) + "; pass a seed cotangent for other outputs");
  backward(loss, xt::ones<T>(loss.value().shape()));
}

template <class T>
void TapeT<T>::release(Entry& e) {
  e.op.reset();
  e.output.reset();
  std::erase_if(e.inputs, [](const std::shared_ptr<Node<T>>& n) { return !n->is_parameter; });
  released_ = true;
}

template <class T>
void TapeT<T>::check_not_released(const char* what) const {
  if (released_)
    throw std::logic_error(std::string(what) +
                           ": this tape released its records during a backward pass (release_during_backward)");
}

template <class T>
void TapeT<T>::backward(const TensorT<T>& out, const ArrayT<T>& seed) {
  if (!out.defined()) throw std::invalid_argument("backward: undefined tensor");
  check_not_released("backward");
  if (shape_of(seed) != out.shape())
    throw std::invalid_argument("backward: seed shape " + shape_str(shape_of(seed)) +
                                " differs from output shape " + shape_str(out.shape()));
  Node<T>* root = out.node();
  if (root->has_grad) root->grad += seed;
  else {
    root->grad = seed;
    root->has_grad = true;
  }
  std::vector<const ArrayT<T>*> values;
  std::vector<GradSlot<T>> slots;
  // the groups whose uses are all complete once record i has run its vjp
  std::vector<std::vector<std::size_t>> complete_after(uses_complete_ ? entries_.size() : 0);
  if (uses_complete_)
    for (std::size_t g = 0; g < grouped_.size(); ++g) complete_after.at(group_first_entry_[g]).push_back(g);
  const auto completed = [&](std::size_t i) {
    if (uses_complete_)
      for (std::size_t g : complete_after[i]) uses_complete_(grouped_[g]);
  };
  for (std::size_t i = entries_.size(); i-- > 0;) {
    Entry& e = entries_[i];
    Node<T>* o = e.output.get();
    if (!o->has_grad) {
      if (release_ && o != root) release(e);
      completed(i);
      continue;
    }
    values.clear();
    slots.clear();
    for (auto& in : e.inputs) {
      values.push_back(&in->value);
      slots.emplace_back(in->requires_grad ? in.get() : nullptr);
    }
    {
      profile::Scope timed(e.op->name(), profile::Phase::vjp);
      e.op->vjp(o->grad, Values<T>(values), o->value, Slots<T>(slots));
    }
    const bool free_now = !retain_grads_ && o != root;
    if (e.op->keeps_output_grad())
      e.op->keep_output_grad(free_now ? std::make_shared<const ArrayT<T>>(std::move(o->grad))
                                      : std::make_shared<const ArrayT<T>>(o->grad));
    if (free_now) {
      o->grad = ArrayT<T>();
      o->has_grad = false;
    }
    if (release_ && o != root) release(e);
    completed(i);
  }
}

template <class T>
ArrayT<T> TapeT<T>::push_tangents(const std::vector<std::pair<const Node<T>*, const ArrayT<T>*>>& seeds,
                                  const TensorT<T>& out, std::size_t k) const {
  if (!out.defined()) throw std::invalid_argument("push_tangents: undefined output");
  if (k == 0) throw std::invalid_argument("push_tangents: needs at least one direction");
  check_not_released("push_tangents");
  std::unordered_map<const Node<T>*, const ArrayT<T>*> seed_of;
  for (const auto& [node, t] : seeds) {
    Shape want{k};
    for (auto d : node->value.shape()) want.push_back(d);
    if (shape_of(*t) != want)
      throw std::invalid_argument("push_tangents: the tangent of '" + node->name + "' has shape " +
                                  shape_str(shape_of(*t)) + ", expected " + shape_str(want));
    seed_of[node] = t;
  }
  // after entry last_use[n], nothing reads node n's tangent
  std::unordered_map<const Node<T>*, std::size_t> last_use;
  for (std::size_t i = 0; i < entries_.size(); ++i)
    for (const auto& in : entries_[i].inputs) last_use[in.get()] = i;
  std::unordered_map<const Node<T>*, ArrayT<T>> pushed;
  std::vector<const ArrayT<T>*> values, dots;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    values.clear();
    dots.clear();
    bool any = false;
    for (const auto& in : e.inputs) {
      values.push_back(&in->value);
      const ArrayT<T>* d = nullptr;
      if (auto s = seed_of.find(in.get()); s != seed_of.end()) d = s->second;
      else if (auto p = pushed.find(in.get()); p != pushed.end()) d = &p->second;
      dots.push_back(d);
      any = any || d;
    }
    if (any && (last_use.count(e.output.get()) || e.output.get() == out.node())) {  // else nothing reads it
      profile::Scope timed(e.op->name(), profile::Phase::jvp);
      pushed[e.output.get()] = e.op->jvp(Values<T>(values), Tangents<T>(dots), e.output->value, k);
    }
    for (const auto& in : e.inputs)
      if (last_use[in.get()] == i && in.get() != out.node()) pushed.erase(in.get());
  }
  if (auto p = pushed.find(out.node()); p != pushed.end()) return std::move(p->second);
  if (auto s = seed_of.find(out.node()); s != seed_of.end()) return *s->second;
  Shape zero{k};
  for (auto d : out.shape()) zero.push_back(d);
  return xt::zeros<T>(zero);
}

template <class T>
std::size_t TapeT<T>::recorded_elements() const {
  std::size_t n = 0;
  for (const auto& e : entries_)
    if (e.output) n += e.output->value.size();
  return n;
}

template <class T>
std::size_t TapeT<T>::largest_recorded() const {
  std::size_t n = 0;
  for (const auto& e : entries_)
    if (e.output) n = std::max(n, e.output->value.size());
  return n;
}

template <class T>
void TapeT<T>::clear() {
  entries_.clear();
  released_ = false;
  grouped_.clear();
  group_of_.clear();
  use_store_.clear();
}

template <class T>
TensorT<T> apply(std::unique_ptr<Op<T>> op, std::span<const TensorT<T>> inputs) {
  std::vector<const ArrayT<T>*> values;
  values.reserve(inputs.size());
  std::size_t k = 0;
  bool any_grad = false;
  for (const auto& t : inputs) {
    if (!t.defined()) throw std::invalid_argument(std::string(op->name()) + ": undefined input tensor");
    values.push_back(&t.value());
    any_grad = any_grad || t.requires_grad();
    if (t.has_tangent()) {
      std::size_t kt = t.tangent_count();
      if (k != 0 && kt != k)
        throw std::invalid_argument(std::string(op->name()) + ": inputs carry different tangent counts (" +
                                    std::to_string(k) + " and " + std::to_string(kt) + ")");
      k = kt;
    }
  }
  auto node = std::make_shared<Node<T>>();
  {
    profile::Scope timed(op->name(), profile::Phase::forward);
    node->value = op->forward(Values<T>(values));
  }
  {
    std::vector<Samples> in_samples;
    in_samples.reserve(inputs.size());
    for (const auto& t : inputs) in_samples.push_back(t.samples());
    node->samples = samples_named(op->samples(in_samples, Values<T>(values), node->value), in_samples, op->name());
  }
  if (k > 0) {
    std::vector<const ArrayT<T>*> dots;
    for (const auto& t : inputs) dots.push_back(t.has_tangent() ? &t.node()->tangent : nullptr);
    profile::Scope timed(op->name(), profile::Phase::jvp);
    node->tangent = op->jvp(Values<T>(values), Tangents<T>(dots), node->value, k);
    node->has_tangent = true;
  }
  TapeT<T>* tape = active_tape<T>();
  if (tape && any_grad) {
    node->requires_grad = true;
    std::vector<std::shared_ptr<Node<T>>> in_nodes;
    in_nodes.reserve(inputs.size());
    for (const auto& t : inputs) in_nodes.push_back(t.shared());
    tape->record(std::move(op), std::move(in_nodes), node);
  }
  return TensorT<T>(node);
}

template <class T>
std::vector<std::string> TapeT<T>::ops_reading(const Node<T>* node) const {
  std::vector<std::string> names;
  for (const Entry& e : entries_)
    for (const auto& in : e.inputs)
      if (in.get() == node && std::find(names.begin(), names.end(), e.name) == names.end())
        names.push_back(e.name);
  return names;
}

template class TapeT<float>;
template class TapeT<double>;
template class RecordScope<float>;
template class RecordScope<double>;
template class NoRecordScope<float>;
template class NoRecordScope<double>;
template TapeT<float>* active_tape();
template TapeT<double>* active_tape();
template TensorT<float> apply(std::unique_ptr<Op<float>>, std::span<const TensorT<float>>);
template TensorT<double> apply(std::unique_ptr<Op<double>>, std::span<const TensorT<double>>);

}  // namespace dpgrad
