// Progress of long work on standard error (docs/library.md): a bar redrawn in
// place on a terminal, otherwise a line every tenth. It shows counts and speed
// only, nothing computed from the data.
#pragma once

#include <string>

namespace dpgrad {

/// A progress display on standard error for one kind of work: pieces done of a
/// total, their rate and the time left.
class Progress {
 public:
  /// `unit` names one piece of work ("step", "trial"); `quiet` prints nothing.
  explicit Progress(std::string unit, bool quiet = false);
  /// One more piece done: `done` of `total` (1-based) of the part named by `label`
  /// ("epoch 3"; empty: the whole work). The speed counts from the first call.
  void update(long done, long total, const std::string& label = "");

 private:
  std::string unit_;
  bool tty_, quiet_;
  double start_ = 0;
  long calls_ = 0;
};

}  // namespace dpgrad
