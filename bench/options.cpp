// dpgrad-bench's options (bench/options.hpp).
#include "bench/options.hpp"

#include <cmath>
#include <stdexcept>

#include <CLI/CLI.hpp>

#include "engine/check.hpp"
#include "layers/registry.hpp"
#include "optim/clipping/clip_spec.hpp"
#include "programs/cli.hpp"

namespace dpgrad::bench {

void check_bench_options(const Options& o) {
  for (const auto& m : o.models)  // the library's registry, or an ONNX file
    if (m.rfind("onnx:", 0) != 0 || m.size() == 5) find_model(m);  // throws naming the models
  for (const auto& m : o.methods) parse_clip_spec(m);  // throws on an unknown one
  for (auto b : o.batches) require(b >= 1, "--batch must be >= 1");
  require(o.optimizer == "sgd" || o.optimizer == "adam", "--optimizer must be sgd or adam");
  require(o.steps >= 1, "--steps must be >= 1");
  require(o.warmup >= 1, "--warmup must be >= 1 (the first step measures memory)");
  require(o.naive_steps >= 1, "--naive-steps must be >= 1");
  require(o.memory_limit_gb > 0 && o.memory_limit_gb <= 4096,
          "--memory-limit-gb must be in (0, 4096] (the search needs a finite limit)");
  require(o.max_batch_start >= 1 && o.max_batch_start <= o.batch_cap,
          "--max-batch-start must be in [1, --batch-cap]: the search doubles from it");
  require(o.batch_cap >= 1, "--batch-cap must be >= 1");
  require(o.limit == "as" || o.limit == "rss", "--limit must be as or rss");
  require(o.max_batch_seconds > 0 && std::isfinite(o.max_batch_seconds) && o.probe_timeout > 0 &&
              std::isfinite(o.probe_timeout),
          "time caps must be finite and > 0");
}

Parsed parse_bench_options(int argc, const char* const* argv) {
  Parsed p;
  Options& o = p.options;
  CLI::App app{"dpgrad-bench: speed and memory of the clipping strategies against non-private training"};
  dpgrad::name_cli_errors(app, "dpgrad-bench");
  app.add_option("--model", o.models, "comma-separated, of:\n" + model_help() + "  onnx:PATH: an ONNX file's model")
      ->delimiter(',');
  app.add_option("--batch", o.batches, "batch sizes (comma-separated)")->check(whole_number())->delimiter(',')->capture_default_str();
  app.add_option("--methods", o.methods, "none, naive, vanilla, ghost, jl:K, microbatch:M (comma-separated)")
      ->delimiter(',');
  app.add_option("--optimizer", o.optimizer, "sgd or adam")->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps per method, after the warm-up")->check(whole_number())->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps per method first (the first one measures memory)")->check(whole_number())
      ->capture_default_str();
  app.add_option("--naive-steps", o.naive_steps, "timed steps of naive (a per-example loop: slow)")->check(whole_number())
      ->capture_default_str();
  app.add_option("--threads", o.threads, "engine threads (0: every core, or DPGRAD_THREADS)")->check(CLI::Range(0, 1024))->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the model and the synthetic batch")->check(whole_number())->capture_default_str();
  app.add_flag("--gemm-detail", o.gemm_detail, "time each matrix product shape of the non-private step on its own");
  app.add_flag("--json", o.json_out, "one JSON object per (model, method, batch) on stdout");
  app.add_option("--markdown", o.markdown, "write the results as a markdown table to this file");
  app.add_option("--suite", o.suite, "default: the suite of ./dev bench (also what no arguments run)");
  app.add_flag("--max-batch", o.max_batch, "find the largest batch each method runs within --memory-limit-gb");
  app.add_option("--memory-limit-gb", o.memory_limit_gb, "memory limit of --max-batch, GiB")->check(real_number())->capture_default_str();
  app.add_option("--limit", o.limit, "as: address space (RLIMIT_AS); rss: peak resident set")->capture_default_str();
  app.add_option("--max-batch-seconds", o.max_batch_seconds, "time cap of one method's search")->check(real_number())->capture_default_str();
  app.add_option("--probe-timeout", o.probe_timeout, "time cap of one probe, seconds")->check(real_number())->capture_default_str();
  app.add_option("--max-batch-start", o.max_batch_start, "first batch size the search tries")->check(whole_number())->capture_default_str();
  app.add_option("--batch-cap", o.batch_cap, "largest batch the search tries")->check(whole_number())->capture_default_str();
  app.add_flag("--noise-cost", p.noise_cost,
               "time one step's noise alone (normal vs grid, seeded and secure generators) against the "
               "method's step (--methods: one method, default ghost)");
  app.add_flag("--norm-routes", p.norm_routes,
               "time the two routes to the per-sample norms of each weight (the Gram of its steps, ghost; and "
               "materialising each sample's gradient) on one recorded batch, against the route picked by shapes");
  app.add_flag("--paired", p.paired,
               "two models (--model A,B, e.g. a built-in one and its ONNX import), one method: their steps "
               "interleaved in one process, A, B, A, B, ..., and the median of the pairwise ratios B / A");
  app.add_option("--child", o.child)->group("");
  app.add_option("--child-method", o.child_method)->group("");
  app.add_option("--child-as-limit", o.child_as_limit)->group("");
  p.exit_code = parse_arguments(app, argc, argv);
  if (p.exit_code) return p;
  for (const auto* opt : app.get_options())
    if (opt->count() > 0) p.given.insert(opt->get_name());
  return p;
}

}  // namespace dpgrad::bench
