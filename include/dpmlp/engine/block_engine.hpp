// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/engine/block_engine.hpp: the per-step engine that runs an EnginePlan (engine/plan.hpp): forward and
// backward over one rank's rows, producing per-block partial sums (the gradient and the sum of the loss's
// terms, loss.hpp) for the block tree. It dispatches to the layered engine (below: a GEMM and an element-wise
// kernel per layer and phase, any depth, any space), the host engine (engine/host_engine.hpp), the fused SIMT
// kernel (engine/fused_simt.hpp) or the tensor engine (backend/cuda/tensor_engine.hpp), and reads what a space
// offers the planner (engine_caps).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "dpmlp/activation.hpp"
#include "dpmlp/backend/cuda/device.hpp"
#include "dpmlp/backend/cuda/tensor_engine.hpp"
#include "dpmlp/backend/side_stream.hpp"
#include "dpmlp/detail/async_copy.hpp"
#include "dpmlp/engine/fused_simt.hpp"
#include "dpmlp/engine/host_engine.hpp"
#include "dpmlp/engine/options.hpp"
#include "dpmlp/engine/plan.hpp"
#include "dpmlp/engine/row_window.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"
#include "dpmlp/linalg/gemm.hpp"
#include "dpmlp/linalg/split_gemm.hpp"
#include "dpmlp/loss.hpp"
#include "dpmlp/mlp.hpp"

namespace dpmlp {

template <class Scalar, class MemorySpace>
ModelShape model_shape(const Mlp<Scalar, MemorySpace>& model) {
  return ModelShape{model.widths(), model.activation(), sizeof(Scalar)};
}

namespace detail {

// The per-step engine. Holds every buffer, so a step allocates nothing. Rows are processed block by block with
// fixed shapes (the plan's block rows; the shard's last block may be short), so each block's partial sums have
// the same bits wherever the block lives. Loss (loss.hpp) is a template argument of every kernel: each engine
// computes the output deltas and the loss sums with its term.
template <class ExecSpace, class Scalar, class Loss = Mse>
class BlockEngine {
  static_assert(is_loss<Loss>::value, "BlockEngine<..., Loss>: Loss must model the Loss concept (loss.hpp)");

 public:
  using memory_space = typename ExecSpace::memory_space;
  using loss_term = loss_term_t<Loss, Scalar>;
  using matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, memory_space>;
  using const_matrix = Kokkos::View<const Scalar**, Kokkos::LayoutRight, memory_space>;

  // Whether this space and scalar have a tensor engine at all (CUDA, float).
#if defined(KOKKOS_ENABLE_CUDA)
  static constexpr bool tensor_space = std::is_same_v<ExecSpace, Kokkos::Cuda> && std::is_same_v<Scalar, float>;
#else
  static constexpr bool tensor_space = false;
#endif
  // Whether the tensor engine computes this loss: its kernels are compiled once, for Mse (any output weights)
  // alone (backend/cuda/tensor_engine.hpp); the plan runs other losses on the fused or layered engine.
  static constexpr bool tensor_loss = std::is_same_v<Loss, Mse>;
  static std::string tensor_loss_unavailable() {
    return std::string("the tensor engine computes the mean squared error (dpmlp::Mse) only, not ") + Loss::name() +
           " (the fused and layered engines compute every loss)";
  }

  BlockEngine() = default;
  // An engine for `rows` rows (this rank's shard) that runs `plan` and learns `loss`.
  BlockEngine(const Mlp<Scalar, memory_space>& model, std::int64_t rows, const EnginePlan& plan,
              const Loss& loss = Loss())
      : model_(model), rows_(rows), plan_(plan) {
    if (plan.engine == Engine::automatic) throw std::logic_error("dpmlp::BlockEngine: an unresolved plan");
    loss.validate(model.outputs());
    {
      // Every output's weight on the device (for the layered engine past LossWeights::inline_count outputs),
      // and the first ones in the term itself.
      const std::vector<double>& w = loss.output_weights();
      loss_weights_ = Kokkos::View<Scalar*, memory_space>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "dpmlp::loss_weights"), model.outputs());
      auto h = Kokkos::create_mirror_view(loss_weights_);
      LossWeights<Scalar> lw;
      for (int j = 0; j < model.outputs(); ++j) {
        h(j) = w.empty() ? Scalar(1) : static_cast<Scalar>(w[static_cast<std::size_t>(j)]);
        if (j < LossWeights<Scalar>::inline_count) lw.first[j] = h(j);
      }
      Kokkos::deep_copy(loss_weights_, h);
      lw.all = loss_weights_.data();
      term_ = loss.template term<Scalar>(lw);
    }
    if (plan_.leaf_group != 1 && !plan.register_resident() && plan.engine != Engine::host) {
      throw InputError("dpmlp: a group of " + std::to_string(plan_.leaf_group) +
                       " blocks a partial-sum row needs the tensor engine's register-resident kernel or the host engine");
    }
    blocks_ = (rows + plan_.block_rows - 1) / plan_.block_rows;
    width_ = static_cast<std::int64_t>(model.num_params()) + 1;
    partials_ = matrix(Kokkos::view_alloc(Kokkos::WithoutInitializing, "dpmlp::partials"),
                       (blocks_ + plan_.leaf_group - 1) / plan_.leaf_group, width_);
    if (plan.engine == Engine::fused) layout_ = fused_layout(model);  // its shape is fixed now
    if (plan.engine == Engine::host) {
      if constexpr (is_host_space<ExecSpace>()) {
        std::vector<std::size_t> woff, boff;
        for (int l = 0; l < model.layers(); ++l) {
          woff.push_back(model.weight_offset(l));
          boff.push_back(model.bias_offset(l));
        }
        host_ = HostEngine<ExecSpace, Scalar>(model.widths(), woff, boff, rows, plan_.block_rows, plan_.leaf_group);
        return;
      } else {
        throw InputError("dpmlp: the host engine runs on host execution spaces (Serial, OpenMP)");
      }
    }
    // The fused kernels keep their activations in team scratch.
    if (plan.engine == Engine::fused || plan.engine == Engine::tensor) return;
    int widest = 0;
    for (int w : model.widths()) widest = w > widest ? w : widest;
    for (int l = 1; l <= model.layers(); ++l) {
      acts_.push_back(matrix(Kokkos::view_alloc(Kokkos::WithoutInitializing, "dpmlp::activations"), rows,
                             model.widths()[l]));
    }
    delta_[0] = matrix(Kokkos::view_alloc(Kokkos::WithoutInitializing, "dpmlp::delta0"), rows, widest);
    delta_[1] = matrix(Kokkos::view_alloc(Kokkos::WithoutInitializing, "dpmlp::delta1"), rows, widest);
    row_scratch_ = Kokkos::View<Scalar*, memory_space>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "dpmlp::rows"),
                                                       rows);
    if (plan_.gemm_split) init_split(widest);
    {
      // The GEMMs over rows (rows x weights, forward and back) may use a workspace (the 3xFP16 kernels split the
      // weights into it once a GEMM): the largest any of them takes. They all run on `space`, one at a time.
      std::size_t bytes = 0;
      const auto& w = model.widths();
      for (int l = 0; l < model.layers(); ++l) {
        const std::size_t i = static_cast<std::size_t>(l);
        linalg::BatchedGemm<Scalar> g;
        g.f16x3 = plan_.gemm_f16x3;
        g.n = w[i + 1], g.k = w[i];
        bytes = std::max(bytes, linalg::gemm_workspace_bytes(ExecSpace(), plan_.gemm, g));
        g.op_b = linalg::Op::T, g.n = w[i], g.k = w[i + 1];
        if (l > 0) bytes = std::max(bytes, linalg::gemm_workspace_bytes(ExecSpace(), plan_.gemm, g));
      }
      if (bytes > 0) {
        gemm_workspace_ = Kokkos::View<unsigned char*, memory_space>(
            Kokkos::view_alloc(Kokkos::WithoutInitializing, "dpmlp::gemm_workspace"), bytes);
      }
    }
    if (plan_.gemm_f16x3) init_split_ahead();
    // The gradients beside the delta chain (compute()), where the GEMMs can run on two streams at once:
    // not the cuBLAS backend, whose handle's workspace is shared by every stream.
    if (!is_host_space<ExecSpace>() && plan_.gemm != linalg::Backend::cublas) {
      side_ = backend::SideStream<ExecSpace>::create();
    }
  }

  // What this space (and its device) offers the planner for `model`. fused_team: also the most threads a fused
  // team can have on a device space (a query of the compiled kernel; the plan needs it only where it may pick
  // the fused engine).
  static EngineCaps caps(const Mlp<Scalar, memory_space>& model, bool fused_team = true) {
    EngineCaps c;
    c.host_space = is_host_space<ExecSpace>();
    c.tensor_unavailable = "the tensor engine runs on CUDA execution spaces in float only";
#if defined(KOKKOS_ENABLE_CUDA)
    if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda>) {
      const backend::CudaDevice& d = backend::cuda_device();
      c.multiprocessors = d.sms;
      c.shared_memory_optin = static_cast<std::size_t>(d.smem_optin > 0 ? d.smem_optin : 0);
      c.shared_memory_sm = static_cast<std::size_t>(d.smem_sm > 0 ? d.smem_sm : 0);
      if constexpr (tensor_space) c.tensor_unavailable = backend::tensor_cores_unavailable();
      if (c.tensor_unavailable.empty() && !tensor_loss) c.tensor_unavailable = tensor_loss_unavailable();
#if defined(DPMLP_HAVE_CUTLASS)
      if constexpr (std::is_same_v<Scalar, float>) {
        c.cutlass_on_wgmma = linalg::cutlass_3xtf32::wgmma_here();
        c.cutlass_on_f16x3 = linalg::cutlass_3xtf32::f16x3_here();
        c.f16x3_on_wgmma = linalg::cutlass_3xtf32::f16x3_wgmma_here();
        c.split_operands = linalg::split_3xtf32::runs_here();
      }
#endif
    }
#endif
    if constexpr (is_host_space<ExecSpace>()) c.multiprocessors = ExecSpace().concurrency();  // threads a rank
    c.team_scratch = max_scratch_bytes();
    if (fused_team) c.fused_team_size = fused_team_size(model);
    c.gemm_reproducible = linalg::default_backend<ExecSpace>(true);
    c.gemm_fast = linalg::default_backend<ExecSpace>(false);
    return c;
  }

  // The plan for `model` on this space (engine/plan.hpp), for steps over `global_rows` rows on `ranks` ranks.
  // The fused kernel is queried only where the plan may pick it: asked for, or the tensor engine unable to run.
  static EnginePlan plan(const Mlp<Scalar, memory_space>& model, const EngineOptions& options, bool reproducible,
                         std::int64_t global_rows, int ranks) {
    const ModelShape m = model_shape(model);
    EngineCaps c = caps(model, false);
    if (options.engine == Engine::fused ||
        (options.engine == Engine::automatic && !detail::tensor_unsupported(m, c).empty())) {
      c.fused_team_size = fused_team_size(model);
    }
    return plan_engine(m, c, options, reproducible, global_rows, ranks);
  }

  // Device spaces: the most threads a fused team can have for `model` (0 where the fused engine does not take
  // it); host spaces run teams of one thread and need none.
  static int fused_team_size(const Mlp<Scalar, memory_space>& model) {
    if (is_host_space<ExecSpace>() || !fused_one_hidden_unsupported(model.widths()).empty()) return 0;
    const FusedLayout lay = fused_layout(model);
    if (!lay.fits) return 0;
    return model.inputs() <= 32 ? fused_team_size_max<32>(model, lay) : fused_team_size_max<64>(model, lay);
  }

  // Team scratch: level 0 (shared memory on a GPU); host spaces, where both levels are plain memory, may
  // also use level 1, which is larger.
  static std::size_t max_scratch_bytes() {
    using policy = Kokkos::TeamPolicy<ExecSpace>;
    const auto l0 = static_cast<std::size_t>(policy::scratch_size_max(0));
    const auto l1 = static_cast<std::size_t>(policy::scratch_size_max(1));
    return is_host_space<ExecSpace>() && l1 > l0 ? l1 : l0;
  }
  static FusedLayout fused_layout(const Mlp<Scalar, memory_space>& model) {
    return FusedLayout(model.inputs(), model.widths()[1], model.outputs(), is_host_space<ExecSpace>(),
                       max_scratch_bytes(), sizeof(Scalar));
  }

  template <int NI>
  using fused_kernel = FusedOneHiddenKernel<ExecSpace, Scalar, NI, is_host_space<ExecSpace>(), loss_term>;

  template <int NI>
  static fused_kernel<NI> make_fused_kernel(const Mlp<Scalar, memory_space>& model, const FusedLayout& lay) {
    using kernel_t = fused_kernel<NI>;
    kernel_t k{};
    k.ld = static_cast<std::int64_t>(model.num_params()) + 1;
    k.n_in = model.inputs();
    k.H = model.widths()[1];
    k.NO = model.outputs();
    k.HP = lay.hp;
    k.NJ = lay.hp / kernel_t::TJ;
    k.C = lay.chunk;
    k.TR = lay.chunk * k.NJ / kernel_t::T;
    k.IPT = NI * k.NJ / kernel_t::T;
    k.w0_shared = lay.w0_shared;
    k.w0off = static_cast<std::int64_t>(model.weight_offset(0));
    k.b0off = static_cast<std::int64_t>(model.bias_offset(0));
    k.w1off = static_cast<std::int64_t>(model.weight_offset(1));
    k.b1off = static_cast<std::int64_t>(model.bias_offset(1));
    k.loss_col = k.ld - 1;
    k.act = model.activation();
    k.params = model.params().data();
    const std::size_t l0 = static_cast<std::size_t>(Kokkos::TeamPolicy<ExecSpace>::scratch_size_max(0));
    k.level = k.scratch_bytes() <= l0 ? 0 : 1;  // a device kernel always uses 0 (fused_layout fits it there)
    return k;
  }


  template <int NI>
  static int fused_team_size_max(const Mlp<Scalar, memory_space>& model, const FusedLayout& lay) {
    auto k = make_fused_kernel<NI>(model, lay);
    typename fused_kernel<NI>::policy policy(1, 1);
    policy.set_scratch_size(k.level, Kokkos::PerTeam(k.scratch_bytes()));
    return policy.team_size_max(k, Kokkos::ParallelForTag());
  }

  const EnginePlan& engine_plan() const { return plan_; }
  Engine engine() const { return plan_.engine; }
  std::int64_t width() const { return width_; }
  std::int64_t blocks() const { return blocks_; }
  int group() const { return plan_.leaf_group; }
  const matrix& partials() const { return partials_; }
  const matrix& output() const { return acts_.back(); }


  // Whether a layer of n_o outputs runs on the engine's own memory-bound kernels (narrow_forward,
  // narrow_backward) rather than GEMMs: on device spaces (host spaces keep their GEMMs) for at most 4 outputs,
  // where a GEMM with n or k = n_o is all memory traffic.
  static constexpr bool narrow_delta(int n_o) { return !is_host_space<ExecSpace>() && n_o <= 4; }

  // Whether the layered engine's GEMMs over rows run as one GEMM over all the shard's rows rather than block by
  // block: where the backend gives a row the same bits whatever the row count (portable, cublaslt), or where
  // the bits need not be reproducible (cublas). Eigen's blocking depends on the sizes, so it goes block by
  // block.
  bool rows_at_once() const { return plan_.gemm != linalg::Backend::eigen && rows_ <= INT_MAX; }

  // Forward pass over x (rows x inputs) into the activations; the last is the prediction.
  void forward(const ExecSpace& space, const const_matrix& x) const { forward(space, x, NoThen()); }

  // The same; where the output layer runs on narrow_forward, that kernel also calls then(r) for every row once
  // the row's predictions are written, and forward returns true; else it returns false and then is not called.
  struct NoThen {
    KOKKOS_INLINE_FUNCTION void operator()(std::int64_t) const {}
  };
  template <class Then>
  bool forward(const ExecSpace& space, const const_matrix& x, const Then& then) const {
    const_matrix in = x;
    bool then_done = false;
    const bool x_split = split_ && prepare_split(space, x);
    if (ahead_jobs_.extent(0) > 0) {
      linalg::split_b_ahead(space, plan_.gemm, ahead_jobs_.data(), static_cast<int>(ahead_jobs_.extent(0)),
                            ahead_max_n_, ahead_max_k_);
    }
    for (int l = 0; l < model_.layers(); ++l) {
      const int n_in = model_.widths()[l], n_out = model_.widths()[l + 1];
      const matrix out = acts_[l];
      const bool last = l + 1 == model_.layers();
      const Activation act = last ? Activation::identity : model_.activation();
      if (narrow_delta(n_out) && narrow_forward(space, n_in, n_out, in.data(), model_.weight(l).data(),
                                                model_.bias(l).data(), out.data(), act, then, last)) {
        then_done = last;
        in = out;
        continue;
      }
      if (split_) {
        // The lo parts of this layer's outputs where the next layer's GEMM reads them.
        Scalar* out_lo = last || !fwd_split_[l + 1] ? nullptr : acts_lo_[l].data();
        if (fwd_split_[l] && (l > 0 || x_split)) {
          const Scalar* in_lo = l == 0 ? x_lo_.data() : acts_lo_[l - 1].data();
          split_rows_gemm(space, static_cast<int>(rows_), n_out, n_in, in.data(), in_lo, n_in,
                          b_split_.data() + fwd_b_off_[l], out.data(), out_lo, n_out,
                          linalg::SplitEpilogue::bias_activation, model_.bias(l).data(), 0, act);
        } else {
          forward_gemm(space, l, in.data(), out, act);
          if (out_lo != nullptr) lo_parts(space, out.data(), n_out, n_out, out_lo);
        }
        in = out;
        continue;
      }
      forward_gemm(space, l, in.data(), out, act);
      in = out;
    }
    return then_done;
  }

  // Layer l's GEMM and its bias and activation, Out = act(In W_l + b_l): in the GEMM's pass where the backend
  // can, else in an element-wise kernel after it.
  void forward_gemm(const ExecSpace& space, int l, const Scalar* in, const matrix& out, Activation act) const {
    const int n_in = model_.widths()[l], n_out = model_.widths()[l + 1];
    const bool added = rows_gemm(space, linalg::Op::N, n_out, n_in, in, n_in, model_.weight(l).data(), n_out,
                                 out.data(), n_out, Fuse::bias_activation, model_.bias(l).data(), 0, act,
                                 ahead_fwd_.empty() ? nullptr : ahead_fwd_[static_cast<std::size_t>(l)]);
    if (!added) {
      const auto bias = model_.bias(l);
      for_each_element(space, "dpmlp::bias_activation", rows_, n_out, KOKKOS_LAMBDA(const std::int64_t r, const int j) {
        out(r, j) = activate(act, out(r, j) + bias(j));
      });
    }
  }

  // Forward and backward: fills partials() with, per block (per group of group() blocks), the gradient of
  // scale * (the sum of the loss's terms w_j l(d) over the block's predictions) (in the parameter layout) and,
  // in the last column, the plain sum of the terms (Mse: of the squared residuals).
  // window: the rows to learn from (a mini-batch), default all.
  void compute(const ExecSpace& space, const const_matrix& x, const const_matrix& y, Scalar scale,
               const RowWindow& window = RowWindow()) const {
    if (rows_ == 0) return;
    if (plan_.engine == Engine::tensor) {
      compute_tensor(space, x, y, scale, window);
      return;
    }
    if (plan_.engine == Engine::host) {
      if constexpr (is_host_space<ExecSpace>()) {
        host_.compute(space, model_.activation(), model_.params().data(), x.data(), x.extent(1) > 0 ? x.stride(0) : 0,
                      y.data(), y.extent(1) > 0 ? y.stride(0) : 0, scale, window, partials_.data(), width_, term_);
      }
      return;
    }
    if (plan_.engine == Engine::fused) {
      if (model_.inputs() <= 32) {
        compute_fused<32>(space, x, y, scale, window);
      } else {
        compute_fused<64>(space, x, y, scale, window);
      }
      return;
    }
    const int L = model_.layers();
    const int n_out = model_.outputs();
    const std::int64_t W = width_;
    const std::int64_t rows = rows_;
    const auto pred = acts_.back();
    const matrix delta = delta_[(L - 1) % 2];
    // Residuals and the output delta (the gradient of scale * the loss's term; Mse: scale * 2 r), one thread a
    // row: in the output layer's own kernel where it has one (forward's `then`), else a kernel of their own;
    // then, per block, the sum of the terms (block_column_sums). The sum is a kernel of its own, so its loop
    // only reads and its loads can be in flight together (a store in the loop would serialize them on a GPU).
    const auto sq = row_scratch_;
    const loss_term loss = term_;
    const auto residual = KOKKOS_LAMBDA(const std::int64_t r) {
      Scalar sum = Scalar(0);
      const bool in = window.contains(r);
      for (int j = 0; j < n_out; ++j) {
        const Scalar res = in ? pred(r, j) - y(r, j) : Scalar(0);
        sum += loss.value(res, j);
        delta(r, j) = loss.grad(res, j, scale);
      }
      sq(r) = sum;
    };
    if (!forward(space, x, residual)) {
      Kokkos::parallel_for("dpmlp::residual", Kokkos::RangePolicy<ExecSpace>(space, 0, rows), residual);
    }
    // The output deltas' lo parts, where a split delta GEMM reads them (32 or more outputs).
    if (split_ && L > 1 && bwd_split_[L - 1]) {
      lo_parts(space, delta.data(), static_cast<std::int64_t>(delta.extent(1)), n_out, delta_lo_[(L - 1) % 2].data());
    }
    // A layer's gradients (which read its deltas) and the loss's block sums run on the side queue, beside the
    // delta chain on `space` (backend/side_stream.hpp). At each layer the two queues meet (fork, then join):
    // the side queue's gradients of layer l then follow its deltas, and, as the deltas alternate between two
    // buffers, the delta written at layer l (into the buffer of layer l + 1's) follows layer l + 1's gradients.
    const backend::SideStream<ExecSpace>& side = side_;
    const ExecSpace& grads = side.space(space);
    for (int l = L - 1; l >= 0; --l) {
      const int n_in = model_.widths()[l], n_o = model_.widths()[l + 1];
      const matrix d = delta_[l % 2];
      const Scalar* a_prev = l == 0 ? x.data() : acts_[l - 1].data();
      const int ld_d = static_cast<int>(d.extent(1));
      const matrix dn = l > 0 ? delta_[(l - 1) % 2] : matrix();
      const int ld_dn = l > 0 ? static_cast<int>(dn.extent(1)) : 0;
      const Activation act = model_.activation();
      side.fork(space);
      side.join(space);
      if (l == L - 1) block_column_sums(grads, "dpmlp::loss_blocks", sq.data(), 1, 1, W - 1);
      // Few outputs (the output layer) below another layer: its weight gradient and the delta below in one
      // pass over A_{l-1} (narrow_backward).
      const bool narrow = l > 0 && narrow_delta(n_o);
      // The lo parts of delta_{l-1} where the delta GEMM of layer l - 1 reads them.
      Scalar* dn_lo = split_ && l > 1 && bwd_split_[l - 1] ? delta_lo_[(l - 1) % 2].data() : nullptr;
      const std::int64_t boff = static_cast<std::int64_t>(model_.bias_offset(l));
      // The blocks whose bias gradients are still to sum: [sum_from, sum_to).
      std::int64_t sum_from = 0, sum_to = blocks_;
      if (narrow) {
        narrow_backward(space, n_in, n_o, a_prev, d.data(), ld_d, model_.weight(l).data(), dn.data(), ld_dn, act,
                        static_cast<std::int64_t>(model_.weight_offset(l)), dn_lo);
      } else {
        // dW_l[block] = A_{l-1}[block]^T * delta_l[block]  (n_in x n_o, summed over the block's rows), and
        // where the GEMM backend can, db_l[block] in the same pass over delta_l.
        blocked_weight_grad(grads, n_in, n_o, a_prev, d.data(), ld_d, model_.weight_offset(l), boff, sum_from,
                            sum_to);
      }
      // db_l[block] = sum over the block's rows of delta_l (block_column_sums' fixed order); the first layer's
      // beside its weight gradient (no delta follows it on `space`).
      block_column_sums(l == 0 ? space : grads, "dpmlp::bias_grad", d.data(), ld_d, n_o, boff, sum_from, sum_to);
      if (l == 0) break;
      if (narrow) continue;
      // delta_{l-1} = (delta_l * W_l^T) .* act'(A_{l-1})
      const auto a = acts_[l - 1];
      if (split_ && bwd_split_[l]) {
        split_rows_gemm(space, static_cast<int>(rows), n_in, n_o, d.data(), delta_lo_[l % 2].data(), ld_d,
                        b_split_.data() + bwd_b_off_[l], dn.data(), dn_lo, ld_dn,
                        linalg::SplitEpilogue::activation_grad, a.data(), n_in, act);
        continue;
      }
      const bool fused = rows_gemm(space, linalg::Op::T, n_in, n_o, d.data(), ld_d, model_.weight(l).data(), n_o,
                                   dn.data(), ld_dn, Fuse::activation_grad, a.data(), n_in, act,
                                   ahead_bwd_.empty() ? nullptr : ahead_bwd_[static_cast<std::size_t>(l)]);
      if (!fused) {
        for_each_element(space, "dpmlp::activation_grad", rows, n_in, KOKKOS_LAMBDA(const std::int64_t r, const int i) {
          dn(r, i) *= activate_grad_from_output(act, a(r, i));
        });
      }
      if (dn_lo != nullptr) lo_parts(space, dn.data(), ld_dn, n_in, dn_lo);
    }
    side.join(space);
  }

  using scratch_vector =
      Kokkos::View<Scalar*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  // The device layout of the per-block column sums (block_column_sums, narrow_backward): a team of
  // kColumnTeam threads a (block, chunk of C columns), C = n rounded up to a power of two, at most 32; thread
  // id = w * C + lane takes column lane of the chunk and lane w of the lanes = kColumnTeam / C that split the
  // column's rows.
  static constexpr int kColumnTeam = 256;
  struct ColumnTeams {
    int C = 1, lanes = kColumnTeam, chunks = 0;
    explicit ColumnTeams(int n) {
      while (C < n && C < 32) C *= 2;
      lanes = kColumnTeam / C;
      chunks = (n + C - 1) / C;
    }
  };

  // A column team's lane sums v combined by the fixed pairwise tree (lane w += lane w + half, for half =
  // lanes / 2, ..., 1) in scratch s of kColumnTeam values; returns s(lane), which on lane w == 0 is the
  // column's total. Ends on the tree's last barrier.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION Scalar lane_tree(const Member& team, const scratch_vector& s, int id, int w, int lanes,
                                                 int C, Scalar v) {
    s(id) = v;
    team.team_barrier();
    for (int half = lanes / 2; half >= 1; half /= 2) {
      if (w < half) s(id) += s(id + half * C);
      team.team_barrier();
    }
    return s(id % C);
  }

  // partials(b, off + j) = the sum over block b's rows r of src[r * ld + j], for j < n and every block. Host
  // spaces: one thread a (block, column), in row order. Device spaces: a team of 256 threads a block and C
  // columns (C = n rounded up to a power of two, at most 32), each column's rows split over 256 / C lanes (lane
  // w takes rows w, w + lanes, ... in order), the lanes then combined by a fixed pairwise tree: coalesced, and
  // many times the parallelism of a thread a column (which, with blocks of thousands of rows, was a chain of
  // thousands of dependent loads). Either order depends on the block's rows alone, so a block has the same
  // bits wherever it lives.
  // Blocks [b_first, b_end) only, where given.
  void block_column_sums(const ExecSpace& space, const char* label, const Scalar* src, std::int64_t ld, int n,
                         std::int64_t off, std::int64_t b_first = 0, std::int64_t b_end = -1) const {
    const matrix part = partials_;
    const std::int64_t block = plan_.block_rows, rows = rows_;
    if (b_end < 0) b_end = blocks_;
    if (b_end <= b_first) return;
    const std::int64_t count = b_end - b_first;
    if constexpr (is_host_space<ExecSpace>()) {
      Kokkos::parallel_for(
          label, Kokkos::RangePolicy<ExecSpace>(space, 0, count * n), KOKKOS_LAMBDA(const std::int64_t idx) {
            const std::int64_t b = b_first + idx / n;
            const int j = static_cast<int>(idx % n);
            const std::int64_t end = (b + 1) * block < rows ? (b + 1) * block : rows;
            Scalar sum = Scalar(0);
            for (std::int64_t r = b * block; r < end; ++r) sum += src[r * ld + j];
            part(b, off + j) = sum;
          });
    } else {
      const ColumnTeams teams(n);
      const int C = teams.C, lanes = teams.lanes, chunks = teams.chunks;
      using policy_t = Kokkos::TeamPolicy<ExecSpace>;
      using member_t = typename policy_t::member_type;
      policy_t policy(space, static_cast<int>(count * chunks), kColumnTeam);
      policy.set_scratch_size(0, Kokkos::PerTeam(scratch_vector::shmem_size(kColumnTeam)));
      Kokkos::parallel_for(label, policy, KOKKOS_LAMBDA(const member_t& team) {
        const std::int64_t b = b_first + team.league_rank() / chunks;
        const int id = team.team_rank(), lane = id % C, w = id / C;
        const int j = (team.league_rank() % chunks) * C + lane;
        const std::int64_t end = (b + 1) * block < rows ? (b + 1) * block : rows;
        Scalar sum = Scalar(0);
        if (j < n) {
          std::int64_t r = b * block + w;
          // Sixteen loads in flight before their use (a lane's rows are a chain of memory latencies otherwise);
          // the sum is still in row order within the lane.
          constexpr int U = 16;
          for (; r + (U - 1) * lanes < end; r += U * lanes) {
            Scalar v[U];
            for (int u = 0; u < U; ++u) v[u] = src[(r + u * lanes) * ld + j];
            for (int u = 0; u < U; ++u) sum += v[u];
          }
          for (; r < end; r += lanes) sum += src[r * ld + j];
        }
        const Scalar total = lane_tree(team, scratch_vector(team.team_scratch(0), kColumnTeam), id, w, lanes, C, sum);
        if (w == 0 && j < n) part(b, off + j) = total;
      });
    }
  }

  // f(r, j) over a rows x cols LayoutRight matrix. Host spaces: a 2-D range, no per-element index division
  // (a 64-bit division is the costliest thing in such a loop on a CPU). Device spaces: a flat range, so
  // consecutive threads touch consecutive columns (coalesced); Kokkos's CUDA MDRange does not map the
  // fastest index to the warp, which made the layered engine several times slower at large sizes.
  template <class F>
  static void for_each_element(const ExecSpace& space, const char* label, std::int64_t rows, int cols, const F& f) {
    if constexpr (is_host_space<ExecSpace>()) {
      using md_policy_t = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2, Kokkos::Iterate::Right, Kokkos::Iterate::Right>,
                                                Kokkos::IndexType<std::int64_t>>;
      typename md_policy_t::point_type lower{{0, 0}}, upper{{rows, std::int64_t(cols)}};
      Kokkos::parallel_for(label, md_policy_t(space, lower, upper),
                           KOKKOS_LAMBDA(const std::int64_t r, const std::int64_t j) { f(r, static_cast<int>(j)); });
    } else if (static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(cols) <= UINT32_MAX) {
      // 32-bit index arithmetic where it fits: a 64-bit division is a long software routine on a GPU, and
      // made these memory-bound kernels several times slower than their traffic.
      const std::uint32_t c = static_cast<std::uint32_t>(cols);
      Kokkos::parallel_for(label, Kokkos::RangePolicy<ExecSpace>(space, 0, rows * cols),
                           KOKKOS_LAMBDA(const std::int64_t idx) {
                             const std::uint32_t u = static_cast<std::uint32_t>(idx);
                             f(static_cast<std::int64_t>(u / c), static_cast<int>(u % c));
                           });
    } else {
      Kokkos::parallel_for(label, Kokkos::RangePolicy<ExecSpace>(space, 0, rows * cols),
                           KOKKOS_LAMBDA(const std::int64_t idx) { f(idx / cols, static_cast<int>(idx % cols)); });
    }
  }

  // Device spaces, a layer of n_out <= 4 outputs (narrow_delta(n_out)) whose weights and a row of inputs fit a
  // team's scratch: Out = act(In * W + bias), each element summed over i in increasing order from +0 and then
  // the bias added, as the portable GEMM and its element-wise kernel do it. A team stages TR rows of In in
  // scratch with coalesced loads, then a thread a (row, output) sums its row from there. A GEMM with
  // n = n_out this thin is all memory traffic. With with_then, then(r) follows for each of the team's rows
  // (the output layer: the residual). Returns false (and does nothing) where it does not run.
  template <class Then>
  bool narrow_forward(const ExecSpace& space, int n_in, int n_out, const Scalar* in, const Scalar* w,
                      const Scalar* bias, Scalar* out, Activation act, const Then& then, bool with_then) const {
    if constexpr (!is_host_space<ExecSpace>()) {
      constexpr int T = 256;  // threads a team
      // In scratch, the rows at pitch P and the weights transposed (a column's n_in weights contiguous, at
      // pitch PW). P is a multiple of 4 whose quarter is odd: every row starts 16-byte aligned, so a thread
      // reads its row four values a load, and the 16-byte reads of eight consecutive rows fall in distinct
      // banks.
      const int PW = (n_in + 3) / 4 * 4;
      const int P = (PW / 4) % 2 == 1 ? PW : PW + 4;
      // Rows of whole 16-byte groups (and `in` 16-byte aligned): copied a group at a time. P is a multiple of 4, so
      // every row of the tile starts 16-byte aligned too.
      constexpr int V = static_cast<int>(16 / sizeof(Scalar));
      const bool wide = n_in % V == 0 && reinterpret_cast<std::uintptr_t>(in) % 16 == 0;
      using policy_t = Kokkos::TeamPolicy<ExecSpace>;
      // The scratch the space gives a team, with room for the two allocations' alignment.
      int TR = (static_cast<int>(policy_t::scratch_size_max(0) / sizeof(Scalar)) - n_out * PW - 64) / P;
      if (TR > 64) TR = 64;
      if (TR < 1) return false;
      // Few rows (a mini-batch): fewer a team, so that the teams still fill the device, but a warp's worth at
      // least. A row's sum is one thread's chain of n_in dependent adds, so more teams of fewer rows gain
      // nothing past the first wave, and every further wave of teams costs a whole chain.
      const std::int64_t teams = std::max<std::int64_t>(1, space.concurrency() / T);
      TR = static_cast<int>(std::min<std::int64_t>(TR, std::max<std::int64_t>(32, (rows_ + teams - 1) / teams)));
      using member_t = typename policy_t::member_type;
      const std::int64_t rows = rows_;
      const std::size_t tile_bytes = sizeof(Scalar) * static_cast<std::size_t>(TR) * P;
      const std::size_t w_bytes = sizeof(Scalar) * static_cast<std::size_t>(n_out) * PW;
      // Light-weight: with `then` (the residual, its loss and views) the functor passes Kokkos's limit for a
      // kernel argument, and a launch through constant memory cannot be captured (compat::light_weight).
      auto policy = compat::light_weight(policy_t(space, static_cast<int>((rows + TR - 1) / TR), T));
      policy.set_scratch_size(0, Kokkos::PerTeam(tile_bytes + w_bytes + 64));
      Kokkos::parallel_for("dpmlp::narrow_forward", policy, KOKKOS_LAMBDA(const member_t& team) {
        const std::int64_t r0 = static_cast<std::int64_t>(team.league_rank()) * TR;
        const int nr = rows - r0 < TR ? static_cast<int>(rows - r0) : TR;
        const int id = team.team_rank();
        Scalar* tile = static_cast<Scalar*>(team.team_scratch(0).get_shmem_aligned(tile_bytes, 16));
        Scalar* wt = static_cast<Scalar*>(team.team_scratch(0).get_shmem_aligned(w_bytes, 16));
        const Scalar* src = in + r0 * n_in;
        // Group e = row * groups + g of N values (N = V where wide, else 1) of the team's rows goes to
        // tile[row * P + g * N], every copy in flight at once (detail::async_copy_n). A thread's groups are T
        // apart: (row, g) advances by (T / groups, T % groups) with one carry, no division.
        const auto copy_rows = [&](auto width) {
          constexpr int N = decltype(width)::value;
          const int groups = n_in / N, gdr = T / groups, gdc = T % groups;
          int row = id / groups, g = id % groups;
          for (int e = id; e < nr * groups; e += T) {
            detail::async_copy_n<N>(&tile[row * P + g * N], &src[e * N]);
            g += gdc;
            row += gdr;
            if (g >= groups) g -= groups, ++row;
          }
        };
        if (wide) {
          copy_rows(std::integral_constant<int, V>());
        } else {
          copy_rows(std::integral_constant<int, 1>());
        }
        for (int e = id; e < n_in * n_out; e += T) detail::async_copy(&wt[(e % n_out) * PW + e / n_out], &w[e]);
        detail::async_copy_wait();
        team.team_barrier();
        for (int t = id; t < nr * n_out; t += T) {
          const int rr = t % nr, j = t / nr;
          // In order over i, four terms a load of the row and of the weights: with few rows a team this one
          // thread's chain is the kernel's time.
          const Scalar* trow = tile + rr * P;
          const Scalar* wcol = wt + j * PW;
          const int n4 = n_in - n_in % 4;
          Scalar acc = Scalar(0);
          for (int i = 0; i < n4; i += 4) {
            Scalar a[4], b[4];
            linalg::detail::load_run<4>(a, trow + i);
            linalg::detail::load_run<4>(b, wcol + i);
            acc += a[0] * b[0];
            acc += a[1] * b[1];
            acc += a[2] * b[2];
            acc += a[3] * b[3];
          }
          for (int i = n4; i < n_in; ++i) acc += trow[i] * wcol[i];
          out[(r0 + rr) * n_out + j] = activate(act, acc + bias[j]);
        }
        if (with_then) {
          team.team_barrier();  // the team's rows' outputs are written (and visible to the whole team)
          for (int rr = id; rr < nr; rr += T) then(r0 + rr);
        }
      });
      return true;
    } else {
      (void)space, (void)n_in, (void)n_out, (void)in, (void)w, (void)bias, (void)out, (void)act, (void)then,
          (void)with_then;
      return false;
    }
  }

  // Device spaces, a layer l > 0 of n_o <= 4 outputs (the output layer): in one pass over A = A_{l-1}
  // (rows x n_in) and the layer's deltas D, both its per-block weight gradient,
  //   partials(b, off + i * n_o + j) = sum over block b's rows r of A(r, i) D(r, j),
  // and the delta of the layer below, Dn(r, i) = (sum_j D(r, j) W(i, j), j increasing from +0) * act'(A(r, i)).
  // A GEMM with n or k = n_o is all memory traffic; this reads A once where a GEMM and a kernel read it twice.
  // The team layout and the sums' order are block_column_sums': a team a block and C columns, each column's
  // rows split over the lanes, each lane in row order, the lanes combined by a fixed pairwise tree; so a
  // block's bits depend on its rows alone.
  // dn_lo: where set, the lo parts of dn too (split operands: the next delta GEMM reads them).
  void narrow_backward(const ExecSpace& space, int n_in, int n_o, const Scalar* a, const Scalar* d, int ld_d,
                       const Scalar* w, Scalar* dn, int ld_dn, Activation act, std::int64_t off,
                       Scalar* dn_lo = nullptr) const {
    switch (n_o) {
      case 1: narrow_backward_n<1>(space, n_in, a, d, ld_d, w, dn, ld_dn, act, off, dn_lo); break;
      case 2: narrow_backward_n<2>(space, n_in, a, d, ld_d, w, dn, ld_dn, act, off, dn_lo); break;
      case 3: narrow_backward_n<3>(space, n_in, a, d, ld_d, w, dn, ld_dn, act, off, dn_lo); break;
      default: narrow_backward_n<4>(space, n_in, a, d, ld_d, w, dn, ld_dn, act, off, dn_lo); break;
    }
  }

  template <int NO>
  void narrow_backward_n(const ExecSpace& space, int n_in, const Scalar* a, const Scalar* d, int ld_d,
                         const Scalar* w, Scalar* dn, int ld_dn, Activation act, std::int64_t off,
                         Scalar* dn_lo) const {
    const matrix part = partials_;
    const std::int64_t block = plan_.block_rows, rows = rows_;
    constexpr int U = 16;  // rows a lane loads before it stores
    const ColumnTeams teams(n_in);
    const int C = teams.C, lanes = teams.lanes, chunks = teams.chunks;
    using policy_t = Kokkos::TeamPolicy<ExecSpace>;
    using member_t = typename policy_t::member_type;
    policy_t policy(space, static_cast<int>(blocks_ * chunks), kColumnTeam);
    policy.set_scratch_size(0, Kokkos::PerTeam(scratch_vector::shmem_size(kColumnTeam)));
    Kokkos::parallel_for("dpmlp::narrow_backward", policy, KOKKOS_LAMBDA(const member_t& team) {
      const std::int64_t b = team.league_rank() / chunks;
      const int id = team.team_rank(), lane = id % C, wl = id / C;
      const int i = (team.league_rank() % chunks) * C + lane;
      const std::int64_t end = (b + 1) * block < rows ? (b + 1) * block : rows;
      Scalar acc[NO];
      for (int j = 0; j < NO; ++j) acc[j] = Scalar(0);
      if (i < n_in) {
        Scalar wi[NO];
        for (int j = 0; j < NO; ++j) wi[j] = w[i * NO + j];
        // One row's work; the loads of U rows go out before any of their stores (a store between them would
        // keep the next loads from being in flight), and acc still takes the rows in order.
        auto row = [&](const Scalar ar, const Scalar* dr, const std::int64_t r) {
          Scalar s = Scalar(0);
          for (int j = 0; j < NO; ++j) {
            s += dr[j] * wi[j];
            acc[j] += ar * dr[j];
          }
          const Scalar v = s * activate_grad_from_output(act, ar);
          dn[r * ld_dn + i] = v;
          if (dn_lo != nullptr) dn_lo[r * ld_dn + i] = lo_part(v);
        };
        std::int64_t r = b * block + wl;
        for (; r + (U - 1) * lanes < end; r += U * lanes) {
          Scalar ar[U], dr[U][NO];
          for (int u = 0; u < U; ++u) {
            ar[u] = a[(r + u * lanes) * n_in + i];
            for (int j = 0; j < NO; ++j) dr[u][j] = d[(r + u * lanes) * ld_d + j];
          }
          for (int u = 0; u < U; ++u) row(ar[u], dr[u], r + u * lanes);
        }
        for (; r < end; r += lanes) {
          Scalar dr[NO];
          for (int j = 0; j < NO; ++j) dr[j] = d[r * ld_d + j];
          row(a[r * n_in + i], dr, r);
        }
      }
      const scratch_vector s(team.team_scratch(0), kColumnTeam);
      for (int j = 0; j < NO; ++j) {
        const Scalar total = lane_tree(team, s, id, wl, lanes, C, acc[j]);
        if (wl == 0 && i < n_in) part(b, off + i * NO + j) = total;
        team.team_barrier();  // every thread has read its total before the next output's sums go in
      }
    });
  }

  template <int NI>
  void compute_fused(const ExecSpace& space, const const_matrix& x, const const_matrix& y, Scalar scale,
                     const RowWindow& window) const {
    using kernel_t = fused_kernel<NI>;
    auto k = make_fused_kernel<NI>(model_, layout_);
    k.x = x.data();
    k.y = y.data();
    k.partials = partials_.data();
    k.rows = rows_;
    k.block = plan_.block_rows;
    k.scale = scale;
    k.loss = term_;
    k.window = window;
    // A device team runs the 256 logical threads at once; a host team of one loops over them.
    const int team = is_host_space<ExecSpace>() ? 1 : kernel_t::T;
    auto policy = typename kernel_t::policy(space, static_cast<int>(blocks_), team);
    policy.set_scratch_size(k.level, Kokkos::PerTeam(k.scratch_bytes()));
    Kokkos::parallel_for("dpmlp::fused_one_hidden", policy, k);
  }

  void compute_tensor(const ExecSpace& space, const const_matrix& x, const const_matrix& y, Scalar scale,
                      const RowWindow& window) const {
#if defined(KOKKOS_ENABLE_CUDA)
    if constexpr (tensor_space && tensor_loss) {
      // What both problems (backend/cuda/tensor_shapes.hpp) take alike: the data, the sums, the step.
      const auto step = [&](auto& p) {
        p.x = x.data();
        p.y = y.data();
        p.params = model_.params().data();
        p.partials = partials_.data();
        p.ld = width_;
        p.rows = rows_;
        p.block = plan_.block_rows;
        p.blocks = blocks_;
        p.scale = scale;
        p.act = model_.activation();
        p.window = window;
        for (int j = 0; j < LossWeights<float>::inline_count; ++j) p.loss_weights[j] = term_.w.first[j];
      };
      if (plan_.kernel == Kernel::tensor_deep) {
        backend::DeepProblem p;
        step(p);
        p.layers = model_.layers() - 1;
        for (int l = 0; l <= model_.layers(); ++l) p.widths[l] = model_.widths()[static_cast<std::size_t>(l)];
        for (int l = 0; l < model_.layers(); ++l) {
          p.woff[l] = static_cast<std::int64_t>(model_.weight_offset(l));
          p.boff[l] = static_cast<std::int64_t>(model_.bias_offset(l));
        }
        backend::compute_tensor_deep(space, p);
        return;
      }
      backend::TensorProblem p;
      step(p);
      p.n_in = model_.inputs();
      p.H = model_.widths()[1];
      p.NO = model_.outputs();
      p.w0off = static_cast<std::int64_t>(model_.weight_offset(0));
      p.b0off = static_cast<std::int64_t>(model_.bias_offset(0));
      p.w1off = static_cast<std::int64_t>(model_.weight_offset(1));
      p.b1off = static_cast<std::int64_t>(model_.bias_offset(1));
      p.kernel = plan_.kernel == Kernel::tensor_warp_matrix         ? backend::TensorLaunch::warp_matrix
                 : plan_.kernel == Kernel::tensor_register_resident ? backend::TensorLaunch::register_resident
                                                                    : backend::TensorLaunch::register_resident_paired;
      backend::compute_tensor(space, p, plan_.leaf_group);
      return;
    }
#endif
    (void)space, (void)x, (void)y, (void)scale, (void)window;
    throw InputError(tensor_space ? tensor_loss_unavailable()
                                  : "dpmlp: the tensor engine runs on CUDA execution spaces in float only");
  }

  // ---- Split operands (plan_.gemm_split, float; linalg/split_gemm.hpp). fwd_split_[l]: layer l's forward
  // GEMM runs split (k = its inputs in whole tiles; not a narrow layer); bwd_split_[l]: the delta GEMM of
  // layer l (delta_{l-1} from delta_l, k = its outputs) does. A split GEMM's A comes with its lo parts, written
  // by whatever wrote A: the GEMM before it (its epilogue), narrow_backward, or lo_parts after an element-wise
  // kernel; the data's in prepare_split, with every split GEMM's B' from this step's weights.

  // The 3xFP16 GEMMs' op(B), the weights in both forms (W for layer l's forward GEMM, W^T for its delta GEMM),
  // split once a forward pass in one launch (forward(): linalg::split_b_ahead), rather than by each GEMM: one
  // job a GEMM the kernels would split op(B) for (gemm_workspace_bytes() > 0), with rows_gemm's shape of it.
  // A mini-batch's step is short enough that a launch a GEMM cost about a fifth of it.
  void init_split_ahead() {
    if constexpr (std::is_same_v<Scalar, float>) {
      const int L = model_.layers();
      const auto& w = model_.widths();
      std::vector<backend::f16x3_layout::SplitBJob> jobs;
      std::vector<std::size_t> offsets;
      std::vector<std::pair<int, bool>> owners;  // (layer, delta)
      std::size_t total = 0;
      for (int l = 0; l < L; ++l) {
        const std::size_t i = static_cast<std::size_t>(l);
        for (const bool delta : {false, true}) {
          if (delta && (l == 0 || narrow_delta(w[i + 1]))) continue;  // no delta GEMM (narrow_backward's)
          linalg::BatchedGemm<Scalar> g;
          g.f16x3 = true;
          g.op_b = delta ? linalg::Op::T : linalg::Op::N;
          g.n = delta ? w[i] : w[i + 1];
          g.k = delta ? w[i + 1] : w[i];
          g.b = model_.weight(l).data();
          g.ldb = w[i + 1];
          const std::size_t bytes = linalg::gemm_workspace_bytes(ExecSpace(), plan_.gemm, g);
          if (bytes == 0) continue;
          backend::f16x3_layout::SplitBJob j;
          j.b = g.b, j.ldb = g.ldb, j.n = g.n, j.k = g.k, j.b_t = delta;
          jobs.push_back(j);
          offsets.push_back(total);
          owners.emplace_back(l, delta);
          total += (bytes + 255) / 256 * 256;
          ahead_max_n_ = std::max(ahead_max_n_, g.n);
          ahead_max_k_ = std::max(ahead_max_k_, g.k);
        }
      }
      if (jobs.empty()) return;
      ahead_split_ = Kokkos::View<unsigned char*, memory_space>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "dpmlp::split_ahead"), total);
      ahead_fwd_.assign(static_cast<std::size_t>(L), nullptr);
      ahead_bwd_.assign(static_cast<std::size_t>(L), nullptr);
      for (std::size_t j = 0; j < jobs.size(); ++j) {
        jobs[j].out = ahead_split_.data() + offsets[j];
        (owners[j].second ? ahead_bwd_ : ahead_fwd_)[static_cast<std::size_t>(owners[j].first)] = jobs[j].out;
      }
      ahead_jobs_ = Kokkos::View<backend::f16x3_layout::SplitBJob*, memory_space>("dpmlp::split_ahead_jobs",
                                                                                 jobs.size());
      auto h = Kokkos::create_mirror_view(ahead_jobs_);
      for (std::size_t j = 0; j < jobs.size(); ++j) h(j) = jobs[j];
      Kokkos::deep_copy(ahead_jobs_, h);
    }
  }

  void init_split(int widest) {
    if constexpr (std::is_same_v<Scalar, float>) {
      if (rows_ > INT_MAX) throw InputError("dpmlp: split operands take at most 2^31 - 1 rows a rank");
      const int L = model_.layers();
      const auto& w = model_.widths();
      const auto whole_tiles = [](int k) { return k % linalg::split_tile_k == 0; };
      split_ = true;
      fwd_split_.assign(static_cast<std::size_t>(L), 0);
      bwd_split_.assign(static_cast<std::size_t>(L), 0);
      fwd_b_off_.assign(static_cast<std::size_t>(L), 0);
      bwd_b_off_.assign(static_cast<std::size_t>(L), 0);
      std::vector<linalg::SplitWeights> segs;
      std::vector<std::int64_t> starts, seg_off;
      std::int64_t total = 0, elements = 0;
      for (int l = 0; l < L; ++l) {
        const std::size_t i = static_cast<std::size_t>(l);
        const int n_in = w[i], n_out = w[i + 1];
        fwd_split_[i] = whole_tiles(n_in) && !narrow_delta(n_out);
        bwd_split_[i] = l > 0 && whole_tiles(n_out) && !narrow_delta(n_out) && widest % 4 == 0;
        for (const bool delta : {false, true}) {
          if (!(delta ? bwd_split_[i] : fwd_split_[i])) continue;
          linalg::SplitWeights sw;
          sw.w = model_.weight(l).data();
          sw.k = delta ? n_out : n_in;
          sw.n = delta ? n_in : n_out;
          sw.transposed = delta;
          (delta ? bwd_b_off_ : fwd_b_off_)[i] = total;
          seg_off.push_back(total);
          total += 3 * sw.size();
          starts.push_back(elements);
          elements += sw.size();
          segs.push_back(sw);
        }
      }
      b_split_ = Kokkos::View<Scalar*, memory_space>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "dpmlp::b_split"), static_cast<std::size_t>(total));
      for (std::size_t j = 0; j < segs.size(); ++j) segs[j].b_split = b_split_.data() + seg_off[j];
      starts.push_back(elements);
      split_elements_ = elements;
      split_segments_ = Kokkos::View<linalg::SplitWeights*, memory_space>("dpmlp::split_segments", segs.size());
      split_starts_ = Kokkos::View<std::int64_t*, memory_space>("dpmlp::split_starts", starts.size());
      {
        auto hs = Kokkos::create_mirror_view(split_segments_);
        auto ht = Kokkos::create_mirror_view(split_starts_);
        for (std::size_t j = 0; j < segs.size(); ++j) hs(j) = segs[j];
        for (std::size_t j = 0; j < starts.size(); ++j) ht(j) = starts[j];
        Kokkos::deep_copy(split_segments_, hs);
        Kokkos::deep_copy(split_starts_, ht);
      }
      const auto alloc = [&](const char* label, std::int64_t cols) {
        return matrix(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), rows_, cols);
      };
      if (fwd_split_[0]) x_lo_ = alloc("dpmlp::x_lo", w[0]);
      acts_lo_.resize(static_cast<std::size_t>(L));
      for (int l = 0; l + 1 < L; ++l) {
        const std::size_t i = static_cast<std::size_t>(l);
        if (fwd_split_[i + 1]) acts_lo_[i] = alloc("dpmlp::activations_lo", w[i + 1]);
      }
      if (std::find(bwd_split_.begin(), bwd_split_.end(), 1) != bwd_split_.end()) {
        delta_lo_[0] = alloc("dpmlp::delta0_lo", widest);
        delta_lo_[1] = alloc("dpmlp::delta1_lo", widest);
      }
    } else {
      (void)widest;
      throw InputError("dpmlp: split operands are the layered engine's float GEMMs");
    }
  }

  // Once a forward pass: every split GEMM's B' from the weights as they are now, and the data's lo parts where
  // layer 0's GEMM runs split; one kernel. Returns whether layer 0's GEMM runs split (x's buffer aligned for it).
  bool prepare_split(const ExecSpace& space, const const_matrix& x) const {
    if constexpr (std::is_same_v<Scalar, float>) {
      const int n_in = model_.inputs();
      const bool x_split = fwd_split_[0] && rows_ > 0 && x.span_is_contiguous() &&
                           linalg::split_takes(n_in, x.data(), x_lo_.data(), n_in);
      const std::int64_t x_count = x_split ? rows_ * n_in : 0;
      const std::int64_t total = x_count + split_elements_;
      if (total == 0) return x_split;
      const float* xp = x.data();
      float* x_lo = x_lo_.data();
      const auto segs = split_segments_;
      const auto starts = split_starts_;
      const int last = static_cast<int>(segs.extent(0)) - 1;
      Kokkos::parallel_for("dpmlp::split_prepare", Kokkos::RangePolicy<ExecSpace>(space, 0, total),
                           KOKKOS_LAMBDA(const std::int64_t i) {
                             if (i < x_count) {
                               x_lo[i] = linalg::tf32_lo(xp[i]);
                               return;
                             }
                             const std::int64_t e = i - x_count;
                             int s = 0;
                             while (s < last && e >= starts(s + 1)) ++s;
                             segs(s)(e - starts(s));
                           });
      return x_split;
    } else {
      (void)space, (void)x;
      return false;
    }
  }

  // C = In (rows x k, ld_in) B (B' at b_split) with the epilogue, over all the rows in one split GEMM; C_lo
  // where out_lo is set.
  void split_rows_gemm(const ExecSpace& space, int rows, int n, int k, const Scalar* in, const Scalar* in_lo,
                       std::int64_t ld_in, const Scalar* b_split, Scalar* out, Scalar* out_lo, std::int64_t ld_out,
                       linalg::SplitEpilogue epilogue, const Scalar* src, std::int64_t ld_src, Activation act) const {
    if constexpr (std::is_same_v<Scalar, float>) {
      linalg::SplitGemm g;
      g.m = rows, g.n = n, g.k = k;
      g.a = in, g.a_lo = in_lo, g.lda = ld_in;
      g.b_split = b_split;
      g.c = out, g.c_lo = out_lo, g.ldc = ld_out;
      g.epilogue = epilogue, g.src = src, g.src_ld = ld_src, g.act = act;
      linalg::split_gemm(space, g);
    } else {
      (void)space, (void)rows, (void)n, (void)k, (void)in, (void)in_lo, (void)ld_in, (void)b_split, (void)out;
      (void)out_lo, (void)ld_out, (void)epilogue, (void)src, (void)ld_src, (void)act;
    }
  }

  // lo[r][j] = tf32_lo(a[r][j]) for the shard's rows, cols columns, leading dimension ld (both).
  void lo_parts(const ExecSpace& space, const Scalar* a, std::int64_t ld, int cols, Scalar* lo) const {
    for_each_element(space, "dpmlp::lo_parts", rows_, cols,
                     KOKKOS_LAMBDA(const std::int64_t r, const int j) { lo[r * ld + j] = lo_part(a[r * ld + j]); });
  }
  static KOKKOS_INLINE_FUNCTION Scalar lo_part(Scalar v) {
    if constexpr (std::is_same_v<Scalar, float>) {
      return linalg::tf32_lo(v);
    } else {
      (void)v;
      return Scalar(0);
    }
  }

 private:
  // What rows_gemm may do in the GEMM's pass: nothing; add the bias `src` and apply the activation (the
  // forward); multiply by the activation's derivative read from its outputs `src` (back-propagation).
  enum class Fuse { none, bias_activation, activation_grad };

  // Out[rows x n] = In[rows x k] * op(W), W shared by every row. Where rows_at_once(), one GEMM over all the
  // shard's rows, which also does `fuse` where the backend can; else block by block (the full blocks in one
  // batched call, the short tail block in another), so each block's bits depend on its rows alone. Returns
  // whether `fuse` was done (else the caller does it).
  // b_split: op(W) split ahead (init_split_ahead), or null.
  bool rows_gemm(const ExecSpace& space, linalg::Op op_w, int n, int k, const Scalar* in, int ld_in, const Scalar* w,
                 int ld_w, Scalar* out, int ld_out, Fuse fuse = Fuse::none, const Scalar* src = nullptr,
                 std::int64_t ld_src = 0, Activation act = Activation::identity,
                 const void* b_split = nullptr) const {
    linalg::BatchedGemm<Scalar> g;
    g.f16x3 = plan_.gemm_f16x3;
    g.workspace = gemm_workspace_.data();
    g.workspace_bytes = gemm_workspace_.extent(0);
    g.b_split = b_split;
    g.op_b = op_w;
    g.n = n;
    g.k = k;
    g.a = in;
    g.lda = ld_in;
    g.b = w;
    g.ldb = ld_w;
    g.c = out;
    g.ldc = ld_out;
    if (rows_at_once()) {
      g.m = static_cast<int>(rows_);
      if (fuse == Fuse::bias_activation) return linalg::gemm_with_bias(space, plan_.gemm, g, src, act);
      if (fuse == Fuse::activation_grad) {
        return linalg::gemm_with_activation_grad(space, plan_.gemm, g, src, ld_src, act);
      }
      linalg::gemm(space, plan_.gemm, g);
      return false;
    }
    const std::int64_t full = rows_ / plan_.block_rows, tail = rows_ - full * plan_.block_rows;
    g.stride_a = plan_.block_rows * ld_in;
    g.stride_c = plan_.block_rows * ld_out;
    g.m = static_cast<int>(plan_.block_rows);
    g.batch = full;
    linalg::gemm(space, plan_.gemm, g);
    if (tail > 0) {
      g.m = static_cast<int>(tail);
      g.batch = 1;
      g.a = in + full * g.stride_a;
      g.c = out + full * g.stride_c;
      linalg::gemm(space, plan_.gemm, g);
    }
    return false;
  }

  // partials[b][off .. off + n_in*n_o) = A[block b]^T * D[block b]
  // With the bias gradients (d's column sums a block, at bias_off) where the backend sums them in the same
  // pass: [sum_from, sum_to) is then what it left to sum (every block, the tail block, the full ones, or none).
  void blocked_weight_grad(const ExecSpace& space, int n_in, int n_o, const Scalar* a, const Scalar* d, int ld_d,
                           std::size_t off, std::int64_t bias_off, std::int64_t& sum_from, std::int64_t& sum_to) const {
    const std::int64_t full = rows_ / plan_.block_rows, tail = rows_ - full * plan_.block_rows;
    linalg::BatchedGemm<Scalar> g;
    g.f16x3 = plan_.gemm_f16x3;
    g.op_a = linalg::Op::T;
    g.op_b = linalg::Op::N;
    g.m = n_in;
    g.n = n_o;
    g.a = a;
    g.lda = n_in;
    g.stride_a = plan_.block_rows * n_in;
    g.b = d;
    g.ldb = ld_d;
    g.stride_b = plan_.block_rows * ld_d;
    g.c = partials_.data() + off;
    g.ldc = n_o;
    g.stride_c = width_;
    g.k = static_cast<int>(plan_.block_rows);
    g.batch = full;
    g.blocks = true;
    g.column_sums = partials_.data() + bias_off;
    const bool full_sums = linalg::gemm(space, plan_.gemm, g) || full == 0;
    bool tail_sums = true;
    if (tail > 0) {
      g.k = static_cast<int>(tail);
      g.batch = 1;
      g.a = a + full * g.stride_a;
      g.b = d + full * g.stride_b;
      g.c = partials_.data() + full * width_ + off;
      g.column_sums = partials_.data() + full * width_ + bias_off;
      tail_sums = linalg::gemm(space, plan_.gemm, g);
    }
    sum_from = full_sums ? full : 0;
    sum_to = tail_sums ? full : blocks_;
  }

  Mlp<Scalar, memory_space> model_;
  std::int64_t rows_ = 0, blocks_ = 0, width_ = 0;
  EnginePlan plan_;  // block rows, leaf group (blocks a row of partials_ sums), GEMMs
  FusedLayout layout_;  // the fused kernel's shape (Engine::fused only)
  loss_term term_;      // the loss's device functor (its weights point into loss_weights_)
  Kokkos::View<Scalar*, memory_space> loss_weights_;
  HostEngine<ExecSpace, Scalar> host_;  // Engine::host only
  matrix partials_;
  std::vector<matrix> acts_;
  matrix delta_[2];
  Kokkos::View<Scalar*, memory_space> row_scratch_;
  Kokkos::View<unsigned char*, memory_space> gemm_workspace_;  // rows_gemm's (linalg::gemm_workspace_bytes)
  backend::SideStream<ExecSpace> side_;  // the layered engine's gradients on device spaces (compute())
  // Split operands (init_split)
  bool split_ = false;
  std::vector<char> fwd_split_, bwd_split_;
  std::vector<std::int64_t> fwd_b_off_, bwd_b_off_;  // where each split GEMM's B' starts in b_split_
  Kokkos::View<Scalar*, memory_space> b_split_;
  Kokkos::View<linalg::SplitWeights*, memory_space> split_segments_;  // prepare_split's work: one a B'
  Kokkos::View<std::int64_t*, memory_space> split_starts_;          // and where each starts (elements of W)
  std::int64_t split_elements_ = 0;
  matrix x_lo_;                   // where fwd_split_[0]
  std::vector<matrix> acts_lo_;   // [l] where fwd_split_[l + 1]
  matrix delta_lo_[2];            // where any bwd_split_
  // The 3xFP16 GEMMs' op(B) split ahead (init_split_ahead): the jobs, their outputs, and layer l's forward
  // (delta) GEMM's split op(B) or null.
  Kokkos::View<backend::f16x3_layout::SplitBJob*, memory_space> ahead_jobs_;
  Kokkos::View<unsigned char*, memory_space> ahead_split_;
  std::vector<const void*> ahead_fwd_, ahead_bwd_;
  int ahead_max_n_ = 0, ahead_max_k_ = 0;
};

}  // namespace detail
}  // namespace dpmlp
