// Everything a program that trains privately with dpgrad needs, in one include:
// #include <dpgrad/dpgrad.hpp>. Compile with `pkg-config --cflags --libs dpgrad`
// or link dpgrad::dpgrad from find_package(dpgrad) in CMake. dpgrad::onnx comes
// with it when dpgrad was built with ONNX (DPGRAD_HAVE_ONNX); dpgrad::mpi is a
// library of its own (engine/mpi.hpp, pkg-config dpgrad-mpi, docs/distributed.md).
#pragma once

#include "engine/config.hpp"

#include "data/augment.hpp"
#include "data/batch.hpp"
#include "data/datasets.hpp"
#include "data/idx.hpp"
#include "data/text_folder.hpp"
#include "engine/communicator.hpp"
#include "engine/progress.hpp"
#include "engine/ops.hpp"
#include "engine/parallel.hpp"
#include "engine/random.hpp"
#include "engine/runtime.hpp"
#include "engine/tape.hpp"
#include "layers/conv.hpp"
#include "layers/dense.hpp"
#include "layers/dropout.hpp"
#include "layers/norm.hpp"
#include "layers/scattering.hpp"
#include "layers/attention.hpp"
#include "layers/embedding.hpp"
#include "layers/gru.hpp"
#include "layers/losses.hpp"
#include "layers/lstm.hpp"
#include "layers/models.hpp"
#include "optim/averaging.hpp"
#include "optim/clipping/check_per_sample.hpp"
#include "optim/checkpoint/checkpoint.hpp"
#include "optim/dp_optimizer.hpp"
#include "optim/pate/teachers.hpp"
#include "optim/run/private_trainer.hpp"
#include "optim/run/report.hpp"
#include "optim/run/tune.hpp"
#include "privacy/accountant.hpp"
#include "privacy/calibration.hpp"
#include "privacy/mechanisms.hpp"
#include "privacy/pate.hpp"
#include "privacy/schedule.hpp"
#include "privacy/selection.hpp"
#if DPGRAD_HAVE_ONNX
#include "onnx/onnx.hpp"
#endif
