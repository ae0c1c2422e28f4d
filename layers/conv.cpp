// Conv2d, MaxPool2d and Reshape layers: compositions of engine ops (im2col,
// linear, max_pool2d, reshape); no derivative is written here.
#include "layers/conv.hpp"

#include <stdexcept>

#include "engine/ops.hpp"
#include "layers/init.hpp"

namespace dpgrad {

template <class T>
Conv2dT<T>::Conv2dT(std::size_t in_channels, std::size_t out_channels, std::size_t kernel_h, std::size_t kernel_w,
                    std::size_t stride, Padding padding, Rng& rng, const std::string& name, bool bias)
    : cin_(in_channels), cout_(out_channels), kh_(kernel_h), kw_(kernel_w), stride_(stride), padding_(padding),
      name_(name) {
  if (cin_ == 0 || cout_ == 0 || kh_ == 0 || kw_ == 0 || stride_ == 0)
    throw std::invalid_argument("Conv2d '" + name + "': channels, kernel and stride must be positive");
  std::size_t fan_in = kh_ * kw_ * cin_;
  w_ = make_parameter<T>(name + ".weight", fan_in_uniform<T>({fan_in, cout_}, fan_in, rng));
  if (bias) b_ = make_parameter<T>(name + ".bias", fan_in_uniform<T>({cout_}, fan_in, rng));
}

template <class T>
Pad2d Conv2dT<T>::pads(const Shape& in) const {
  if (in.size() != 4 || in[3] != cin_)
    throw std::invalid_argument("Conv2d '" + name_ + "': input must be (B, H, W, " + std::to_string(cin_) + "), got " +
                                shape_str(in));
  return resolve_padding(padding_, in[1], in[2], kh_, kw_, stride_, stride_);
}

template <class T>
Shape Conv2dT<T>::output_shape(const Shape& in) const {
  Pad2d p = pads(in);
  return {in[0], window_output_size(in[1], kh_, stride_, p.top, p.bottom),
          window_output_size(in[2], kw_, stride_, p.left, p.right), cout_};
}

template <class T>
TensorT<T> Conv2dT<T>::forward(const TensorT<T>& x) {
  return conv2d(x, w_, b_, kh_, kw_, stride_, stride_, pads(x.shape()));
}

template <class T>
std::vector<TensorT<T>> Conv2dT<T>::parameters() const {
  if (b_.defined()) return {w_, b_};
  return {w_};
}

template <class T>
MaxPool2dT<T>::MaxPool2dT(std::size_t kernel, std::size_t stride) : kernel_(kernel), stride_(stride) {
  if (kernel == 0 || stride == 0) throw std::invalid_argument("MaxPool2d: kernel and stride must be positive");
}

template <class T>
TensorT<T> MaxPool2dT<T>::forward(const TensorT<T>& x) {
  return max_pool2d(x, kernel_, stride_);
}

template <class T>
ReshapeT<T>::ReshapeT(Shape sample_shape) : sample_(std::move(sample_shape)) {}

template <class T>
TensorT<T> ReshapeT<T>::forward(const TensorT<T>& x) {
  Shape s = x.shape();
  if (s.empty()) throw std::invalid_argument("Reshape: input needs a batch axis");
  std::size_t per = s[0] == 0 ? 0 : x.size() / s[0];
  if (s[0] != 0 && per != numel(sample_))
    throw std::invalid_argument("Reshape: cannot reshape examples of " + shape_str(s) + " to " + shape_str(sample_));
  Shape to{s[0]};
  to.insert(to.end(), sample_.begin(), sample_.end());
  return reshape(x, to);
}

template class Conv2dT<float>;
template class Conv2dT<double>;
template class MaxPool2dT<float>;
template class MaxPool2dT<double>;
template class ReshapeT<float>;
template class ReshapeT<double>;

}  // namespace dpgrad
