// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/mlp.hpp: the network. A fully connected MLP, inputs -> hidden layers -> outputs, with its parameters
// in one contiguous buffer (so a gradient is one buffer and one collective), forward, MSE loss, and value
// and gradient.
//
// Parameter layout, layer l = 0 .. L-1 with widths w[l] -> w[l+1]:
//   [ W_0 (w0 x w1, row-major: inputs x outputs, as in JAX), b_0 (w1), W_1 (w1 x w2), b_1 (w2), ... ]
// Hidden layers use the model's activation; the last layer is linear (regression).
#pragma once

#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "dpmlp/activation.hpp"
#include "dpmlp/backend/cuda_tensor_core.hpp"
#include "dpmlp/detail/fused_one_hidden.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"
#include "dpmlp/linalg/gemm.hpp"
#include "dpmlp/random.hpp"
#include "dpmlp/reduction.hpp"

namespace dpmlp {


// A small copyable view of a model for inference inside a user's kernels, on any execution space that can
// read the model's memory: `eval(inputs, outputs)` for one row, where inputs and outputs are anything
// indexable with (i): rank-1 Views or subviews, or a plain pointer wrapped in an unmanaged View. It keeps
// two rows of activations on the stack, so the widest layer may have at most MaxWidth units (checked when
// the evaluator is made) and there may be at most MaxLayers layers.
template <class Scalar, int MaxWidth = 256, int MaxLayers = 8>
struct Evaluator {
  const Scalar* params = nullptr;
  int layers = 0;
  int widths[MaxLayers + 1] = {};
  Activation activation = Activation::relu;

  template <class In, class Out>
  KOKKOS_INLINE_FUNCTION void operator()(const In& in, const Out& out) const {
    Scalar buf[2][MaxWidth];
    for (int i = 0; i < widths[0]; ++i) buf[0][i] = static_cast<Scalar>(in(i));
    const Scalar* w = params;
    int cur = 0;
    for (int l = 0; l < layers; ++l) {
      const int n_in = widths[l], n_out = widths[l + 1];
      const Scalar* b = w + n_in * n_out;
      const bool last = l + 1 == layers;
      for (int j = 0; j < n_out; ++j) {
        Scalar z = Scalar(0);
        for (int i = 0; i < n_in; ++i) z += buf[cur][i] * w[i * n_out + j];
        z = z + b[j];
        buf[1 - cur][j] = last ? z : detail::activate(activation, z);
      }
      w = b + n_out;
      cur = 1 - cur;
    }
    for (int j = 0; j < widths[layers]; ++j) out(j) = buf[cur][j];
  }
};

template <class Scalar = float, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class Mlp {
  static_assert(std::is_floating_point<Scalar>::value, "dpmlp::Mlp: Scalar must be float or double");

 public:
  using scalar_type = Scalar;
  using memory_space = MemorySpace;
  using params_type = Kokkos::View<Scalar*, MemorySpace>;
  using matrix_type = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using vector_type = Kokkos::View<Scalar*, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  // widths = {inputs, hidden..., outputs}; at least {inputs, outputs}. The seed's model is the default.
  explicit Mlp(std::vector<int> widths = {32, 32, 1}, Activation hidden = Activation::relu)
      : widths_(std::move(widths)), activation_(hidden) {
    if (widths_.size() < 2) throw InputError("dpmlp::Mlp: widths needs at least {inputs, outputs}");
    for (std::size_t i = 0; i < widths_.size(); ++i) {
      if (widths_[i] <= 0) {
        throw InputError("dpmlp::Mlp: width " + std::to_string(i) + " is " + std::to_string(widths_[i]) +
                         "; widths must be positive");
      }
    }
    std::size_t off = 0;
    for (int l = 0; l < layers(); ++l) {
      weight_offset_.push_back(off);
      off += std::size_t(widths_[l]) * widths_[l + 1];
      bias_offset_.push_back(off);
      off += widths_[l + 1];
    }
    params_ = params_type("dpmlp::Mlp::params", off);
  }

  int layers() const { return static_cast<int>(widths_.size()) - 1; }
  int inputs() const { return widths_.front(); }
  int outputs() const { return widths_.back(); }
  const std::vector<int>& widths() const { return widths_; }
  Activation activation() const { return activation_; }
  std::size_t num_params() const { return params_.extent(0); }
  std::size_t weight_offset(int l) const { return weight_offset_.at(l); }
  std::size_t bias_offset(int l) const { return bias_offset_.at(l); }

  // All parameters, contiguous. Copies of an Mlp share them (Kokkos View semantics); clone() does not.
  params_type params() const { return params_; }
  matrix_type weight(int l) const {
    return matrix_type(params_.data() + weight_offset(l), widths_[l], widths_[l + 1]);
  }
  vector_type bias(int l) const { return vector_type(params_.data() + bias_offset(l), widths_[l + 1]); }

  // Device-callable inference for one row (see Evaluator). It reads the parameters in place: it sees
  // training's updates, and must not outlive the model's parameter buffer.
  template <int MaxWidth = 256, int MaxLayers = 8>
  Evaluator<Scalar, MaxWidth, MaxLayers> evaluator() const {
    Evaluator<Scalar, MaxWidth, MaxLayers> e;
    if (layers() > MaxLayers) {
      throw InputError("dpmlp::Mlp::evaluator: " + std::to_string(layers()) + " layers, at most " +
                       std::to_string(MaxLayers) + " (raise MaxLayers)");
    }
    for (int w : widths_) {
      if (w > MaxWidth) {
        throw InputError("dpmlp::Mlp::evaluator: a layer of " + std::to_string(w) + " units, at most " +
                         std::to_string(MaxWidth) + " (raise MaxWidth)");
      }
    }
    e.params = params_.data();
    e.layers = layers();
    for (int i = 0; i <= layers(); ++i) e.widths[i] = widths_[i];
    e.activation = activation_;
    return e;
  }

  Mlp clone() const {
    Mlp copy(widths_, activation_);
    Kokkos::deep_copy(copy.params_, params_);
    return copy;
  }

  // JAX's initialization in the seed: keys = split(key, layers); W_l = normal(keys[l], (w_l, w_{l+1})) * scale;
  // biases zero. For the seed's 2 layers, split(key, 2) is jax.random.split(key).
  template <class ExecSpace = typename MemorySpace::execution_space>
  void init_jax(random::Key key, Scalar scale = Scalar(0.1), const ExecSpace& space = ExecSpace()) {
    const auto keys = random::split(key, layers());
    Kokkos::deep_copy(space, params_, Scalar(0));
    for (int l = 0; l < layers(); ++l) {
      auto w = Kokkos::subview(params_, std::make_pair(weight_offset(l), bias_offset(l)));
      random::normal(space, keys[l], w, 0);
      const Scalar s = scale;
      Kokkos::parallel_for(
          "dpmlp::Mlp::init_scale", Kokkos::RangePolicy<ExecSpace>(space, 0, w.extent(0)),
          KOKKOS_LAMBDA(const std::int64_t i) { w(i) = w(i) * s; });
    }
    compat::fence(space, "dpmlp::Mlp::init_jax");
  }

 private:
  std::vector<int> widths_;
  Activation activation_;
  std::vector<std::size_t> weight_offset_, bias_offset_;
  params_type params_;
};

namespace detail {

// The per-step engine: forward and backward over one rank's rows, producing per-block partial sums
// (gradient and sum of squared residuals) for the block tree. Holds every buffer, so a step allocates
// nothing. Rows are processed block by block with fixed shapes (`block` rows; the shard's last block may be
// short), so each block's partial sums have the same bits wherever the block lives.
template <class ExecSpace, class Scalar>
class BlockEngine {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, memory_space>;
  using const_matrix = Kokkos::View<const Scalar**, Kokkos::LayoutRight, memory_space>;

  BlockEngine() = default;
  // The sums a block produces for `model`: its parameters' gradients and the sum of squared residuals (the
  // width of the partial sums; the default block size caps blocks x this).
  static std::int64_t sums_per_block(const Mlp<Scalar, memory_space>& model) {
    return static_cast<std::int64_t>(model.num_params()) + 1;
  }
  // The most blocks a step of the default block size has (default_block_rows) for `model` on the resolved
  // engine `kind`: 2048 where the tensor engine's register-resident kernel runs at every block count (one
  // output, relu or identity, 32 or fewer inputs: backend::mma_at_every_count), whose partial sums and
  // their tree then halve, else 4096. One H200, ms per 100 steps, blocks of 2x the rows (docs/benchmarks.md,
  // 2026-12-02 10:50 UTC): 1M x 64 23.6 -> 18.8, 1M x 32 9.04 -> 8.80, 524288 x 32 (a rank's share of 1M on
  // two GPUs) 5.42 -> 5.17, 262144 x 32 3.71 -> 3.43. (The wide models' block count is bound by their
  // partial sums' size already: 1024 blocks at 1M x 256.) Not measured for the other engines: they keep 4096.
  // Independent of the environment (DPMLP_TENSOR_KERNEL), so every rank takes the same.
  static std::int64_t default_most_blocks(const Mlp<Scalar, memory_space>& model, Engine kind) {
#if defined(KOKKOS_ENABLE_CUDA)
    if constexpr (tensor_space) {
      if (kind == Engine::tensor && backend::mma_at_every_count(model.inputs(), model.widths()[1], model.outputs(),
                                                                model.activation())) {
        return 2048;
      }
    }
#endif
    (void)model, (void)kind;
    return 4096;
  }
  // The default rows a block (dpmlp::default_block_rows) for `model` on the resolved engine `kind`.
  static std::int64_t default_block_rows(const Mlp<Scalar, memory_space>& model, Engine kind,
                                         std::int64_t global_rows) {
    return dpmlp::default_block_rows(global_rows, sums_per_block(model), default_most_blocks(model, kind));
  }
  // engine: Engine::fused, tensor or layered (resolve_engine turns automatic into one of them).
  // global_blocks: the blocks of a step over every rank (0: this engine's own, one rank); the tensor engine
  // picks its kernel from it, so every rank count runs the same kernel.
  // group: blocks a row of partials sums (leaf_group; 1: a row a block, the only value other engines take).
  BlockEngine(const Mlp<Scalar, memory_space>& model, std::int64_t rows, std::int64_t block, linalg::Backend gemm,
              Engine engine = Engine::layered, std::int64_t global_blocks = 0, int group = 1)
      : model_(model), rows_(rows), block_(block), group_(group), gemm_(gemm), kind_(engine) {
    blocks_ = (rows + block - 1) / block;
    tensor_kernel_ = tensor_kernel_for(model, kind_, global_blocks > 0 ? global_blocks : blocks_, block_);
    if (group_ != 1 && tensor_kernel_ != 1) {
      throw InputError("dpmlp: a group of " + std::to_string(group_) +
                       " blocks a partial-sum row needs the tensor engine's register-resident kernel");
    }
    width_ = sums_per_block(model);
    partials_ = matrix(Kokkos::view_alloc(Kokkos::WithoutInitializing, "dpmlp::partials"),
                       (blocks_ + group_ - 1) / group_, width_);
    if (kind_ == Engine::fused) layout_ = fused_layout(model);  // its shape is fixed now
    // The fused kernels keep their activations in team scratch.
    if (kind_ == Engine::fused || kind_ == Engine::tensor) return;
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
  }

  // Which tensor kernel `engine` runs for this model at `global_blocks` blocks a step of `block_rows` rows each
  // (0: not known; tensor_kernel()'s code).
  static int tensor_kernel_for(const Mlp<Scalar, memory_space>& model, Engine engine, std::int64_t global_blocks,
                               std::int64_t block_rows = 0) {
#if defined(KOKKOS_ENABLE_CUDA)
    if constexpr (tensor_space) {
      if (engine == Engine::tensor) {
        return static_cast<int>(backend::tensor_kernel_for(model.inputs(), model.widths()[1], model.outputs(),
                                                           model.activation(), global_blocks, block_rows));
      }
    }
#endif
    (void)model, (void)engine, (void)global_blocks, (void)block_rows;
    return 0;
  }
  // How many consecutive blocks a row of this engine's partial sums holds (summed in the block tree's shape,
  // so the same bits as a row a block) at `global_blocks` blocks a step over `ranks` ranks: more than one only
  // for the register-resident tensor kernel (backend::mma_group). The block tree's leaves are then groups: the
  // caller's BlockTreePlan takes blocks of block x group rows, the engine blocks of block rows.
  static int leaf_group(const Mlp<Scalar, memory_space>& model, Engine engine, std::int64_t global_blocks, int ranks,
                        std::int64_t block_rows = 0) {
#if defined(KOKKOS_ENABLE_CUDA)
    if constexpr (tensor_space) {
      if (tensor_kernel_for(model, engine, global_blocks, block_rows) == 1) {
        return backend::mma_group(model.widths()[1], model.outputs(), global_blocks, ranks);
      }
    }
#endif
    (void)model, (void)engine, (void)global_blocks, (void)ranks, (void)block_rows;
    return 1;
  }

  // Whether this space and scalar have a tensor engine at all (CUDA, float).
#if defined(KOKKOS_ENABLE_CUDA)
  static constexpr bool tensor_space = std::is_same_v<ExecSpace, Kokkos::Cuda> && std::is_same_v<Scalar, float>;
#else
  static constexpr bool tensor_space = false;
#endif

  // The reason the tensor engine cannot run this model here, or "".
  static std::string tensor_unsupported(const Mlp<Scalar, memory_space>& model) {
#if defined(KOKKOS_ENABLE_CUDA)
    if (tensor_space) {
      const std::string why = fused_one_hidden_unsupported(model.widths());
      return why.empty() ? backend::tensor_unsupported(model.inputs(), model.widths()[1], model.outputs()) : why;
    }
#endif
    (void)model;
    return "the tensor engine runs on CUDA execution spaces in float only";
  }

  // Engine::automatic -> tensor where it can run; else fused on device spaces when the model qualifies and
  // its team scratch fits; else layered. Engine::fused or tensor for a model it cannot run -> InputError
  // saying why.
  static Engine resolve_engine(const Mlp<Scalar, memory_space>& model, Engine requested) {
    if (requested == Engine::layered) return requested;
    if (requested == Engine::tensor || requested == Engine::automatic) {
      const std::string why = tensor_unsupported(model);
      if (why.empty()) return Engine::tensor;
      if (requested == Engine::tensor) throw InputError("dpmlp: " + why);
    }
    std::string why = fused_one_hidden_unsupported(model.widths());
    if (why.empty()) {
      const FusedLayout lay = fused_layout(model);
      if (!lay.fits) {
        why = "the fused engine's team scratch for " + std::to_string(model.widths()[1]) +
              " hidden units does not fit the space's " + std::to_string(max_scratch_bytes()) + " bytes";
      } else if (!is_host_space<ExecSpace>()) {
        // A device team must run all 256 logical threads at once (their accumulators are registers).
        const int most = model.inputs() <= 32 ? fused_team_size_max<32>(model) : fused_team_size_max<64>(model);
        if (most < FusedLayout::T) {
          why = "the fused kernel needs teams of " + std::to_string(FusedLayout::T) + " threads, the space allows " +
                std::to_string(most);
        }
      }
    }
    if (requested == Engine::fused) {
      if (!why.empty()) throw InputError("dpmlp: " + why);
      return Engine::fused;
    }
    return why.empty() && !is_host_space<ExecSpace>() ? Engine::fused : Engine::layered;
  }

  Engine engine() const { return kind_; }

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
  using fused_kernel = FusedOneHiddenKernel<ExecSpace, Scalar, NI, is_host_space<ExecSpace>()>;

  template <int NI>
  static fused_kernel<NI> make_fused_kernel(const Mlp<Scalar, memory_space>& model, const FusedLayout& lay) {
    using kernel_t = fused_kernel<NI>;
    kernel_t k{};
    k.ld = sums_per_block(model);
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
  static int fused_team_size_max(const Mlp<Scalar, memory_space>& model) {
    auto k = make_fused_kernel<NI>(model, fused_layout(model));
    typename fused_kernel<NI>::policy policy(1, 1);
    policy.set_scratch_size(k.level, Kokkos::PerTeam(k.scratch_bytes()));
    return policy.team_size_max(k, Kokkos::ParallelForTag());
  }

  std::int64_t width() const { return width_; }
  std::int64_t blocks() const { return blocks_; }
  int group() const { return group_; }
  Engine kind() const { return kind_; }
  // Which tensor kernel a step runs: 0 none (another engine), 1 register-resident, 2 warp-matrix.
  int tensor_kernel() const { return tensor_kernel_; }
  const matrix& partials() const { return partials_; }
  const matrix& output() const { return acts_.back(); }

  // Forward pass over x (rows x inputs) into the activations; the last is the prediction.
  void forward(const ExecSpace& space, const const_matrix& x) const {
    const_matrix in = x;
    for (int l = 0; l < model_.layers(); ++l) {
      const int n_in = model_.widths()[l], n_out = model_.widths()[l + 1];
      const matrix out = acts_[l];
      blocked_gemm(space, linalg::Op::N, linalg::Op::N, n_out, n_in, in.data(), n_in, model_.weight(l).data(), n_out,
                   0, out.data(), n_out, std::int64_t(block_) * n_out, block_ * n_in);
      const Activation act = l + 1 == model_.layers() ? Activation::identity : model_.activation();
      const auto bias = model_.bias(l);
      for_each_element(space, "dpmlp::bias_activation", rows_, n_out, KOKKOS_LAMBDA(const std::int64_t r, const int j) {
        out(r, j) = activate(act, out(r, j) + bias(j));
      });
      in = out;
    }
  }

  // Forward and backward: fills partials() with, per block (per group of group() blocks), the gradient of
  // scale * sum(residual^2) (in the parameter layout) and, in the last column, the plain sum of squared
  // residuals.
  // window: the rows to learn from (a mini-batch), default all.
  void compute(const ExecSpace& space, const const_matrix& x, const const_matrix& y, Scalar scale,
               const RowWindow& window = RowWindow()) const {
    if (rows_ == 0) return;
    if (kind_ == Engine::tensor) {
      compute_tensor(space, x, y, scale, window);
      return;
    }
    if (kind_ == Engine::fused) {
      if (model_.inputs() <= 32) {
        compute_fused<32>(space, x, y, scale, window);
      } else {
        compute_fused<64>(space, x, y, scale, window);
      }
      return;
    }
    forward(space, x);
    const int L = model_.layers();
    const int n_out = model_.outputs();
    const std::int64_t W = width_;
    const std::int64_t block = block_;
    const std::int64_t rows = rows_;
    const auto pred = acts_.back();
    const matrix delta = delta_[(L - 1) % 2];
    const matrix part = partials_;
    // Residuals and the output delta (scale * 2 r: the gradient of scale * r^2), one thread a row; then,
    // per block, the sum of r^2 in row order. Two kernels, so the summing loop only reads and its loads can
    // be in flight together (a store in the loop would serialize them on a GPU).
    const auto sq = row_scratch_;
    Kokkos::parallel_for(
        "dpmlp::residual", Kokkos::RangePolicy<ExecSpace>(space, 0, rows), KOKKOS_LAMBDA(const std::int64_t r) {
          Scalar sum = Scalar(0);
          const bool in = window.contains(r);
          for (int j = 0; j < n_out; ++j) {
            const Scalar res = in ? pred(r, j) - y(r, j) : Scalar(0);
            sum += res * res;
            delta(r, j) = Scalar(2) * scale * res;
          }
          sq(r) = sum;
        });
    Kokkos::parallel_for(
        "dpmlp::loss_blocks", Kokkos::RangePolicy<ExecSpace>(space, 0, blocks_), KOKKOS_LAMBDA(const std::int64_t b) {
          Scalar sum = Scalar(0);
          const std::int64_t end = (b + 1) * block < rows ? (b + 1) * block : rows;
          std::int64_t r = b * block;
          for (; r + 8 <= end; r += 8) {  // loads in flight together; the order of the sum is unchanged
            Scalar v[8];
            for (int u = 0; u < 8; ++u) v[u] = sq(r + u);
            for (int u = 0; u < 8; ++u) sum += v[u];
          }
          for (; r < end; ++r) sum += sq(r);
          part(b, W - 1) = sum;
        });
    for (int l = L - 1; l >= 0; --l) {
      const int n_in = model_.widths()[l], n_o = model_.widths()[l + 1];
      const matrix d = delta_[l % 2];
      const Scalar* a_prev = l == 0 ? x.data() : acts_[l - 1].data();
      const int ld_d = static_cast<int>(d.extent(1));
      // dW_l[block] = A_{l-1}[block]^T * delta_l[block]  (n_in x n_o, summed over the block's rows)
      blocked_weight_grad(space, n_in, n_o, a_prev, d.data(), ld_d, model_.weight_offset(l));
      // db_l[block] = sum over the block's rows of delta_l, in row order
      const std::int64_t boff = static_cast<std::int64_t>(model_.bias_offset(l));
      Kokkos::parallel_for(
          "dpmlp::bias_grad", Kokkos::RangePolicy<ExecSpace>(space, 0, blocks_ * n_o),
          KOKKOS_LAMBDA(const std::int64_t idx) {
            const std::int64_t b = idx / n_o;
            const int j = static_cast<int>(idx % n_o);
            const std::int64_t end = (b + 1) * block < rows ? (b + 1) * block : rows;
            Scalar sum = Scalar(0);
            std::int64_t r = b * block;
            for (; r + 8 <= end; r += 8) {  // loads in flight together; the order of the sum is unchanged
              Scalar v[8];
              for (int u = 0; u < 8; ++u) v[u] = d(r + u, j);
              for (int u = 0; u < 8; ++u) sum += v[u];
            }
            for (; r < end; ++r) sum += d(r, j);
            part(b, boff + j) = sum;
          });
      if (l == 0) break;
      // delta_{l-1} = (delta_l * W_l^T) .* act'(A_{l-1})
      const matrix dn = delta_[(l - 1) % 2];
      const int ld_dn = static_cast<int>(dn.extent(1));
      blocked_gemm(space, linalg::Op::N, linalg::Op::T, n_in, n_o, d.data(), ld_d, model_.weight(l).data(), n_o, 0,
                   dn.data(), ld_dn, block * ld_dn, block * ld_d);
      const auto a = acts_[l - 1];
      const Activation act = model_.activation();
      for_each_element(space, "dpmlp::activation_grad", rows, n_in, KOKKOS_LAMBDA(const std::int64_t r, const int i) {
        dn(r, i) *= activate_grad_from_output(act, a(r, i));
      });
    }
  }

  // f(r, j) over a rows x cols LayoutRight matrix. Host spaces: a 2-D range, no per-element index division
  // (a 64-bit division is the costliest thing in such a loop on a CPU). Device spaces: a flat range, so
  // consecutive threads touch consecutive columns (coalesced); Kokkos's CUDA MDRange does not map the
  // fastest index to the warp, and on 2xH200 it made the layered engine 2.5x slower at 4M x 256.
  template <class F>
  static void for_each_element(const ExecSpace& space, const char* label, std::int64_t rows, int cols, const F& f) {
    if constexpr (is_host_space<ExecSpace>()) {
      using md_policy_t = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2, Kokkos::Iterate::Right, Kokkos::Iterate::Right>,
                                                Kokkos::IndexType<std::int64_t>>;
      typename md_policy_t::point_type lower{{0, 0}}, upper{{rows, std::int64_t(cols)}};
      Kokkos::parallel_for(label, md_policy_t(space, lower, upper),
                           KOKKOS_LAMBDA(const std::int64_t r, const std::int64_t j) { f(r, static_cast<int>(j)); });
    } else {
      Kokkos::parallel_for(label, Kokkos::RangePolicy<ExecSpace>(space, 0, rows * cols),
                           KOKKOS_LAMBDA(const std::int64_t idx) { f(idx / cols, static_cast<int>(idx % cols)); });
    }
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
    k.block = block_;
    k.scale = scale;
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
    if constexpr (tensor_space) {
      backend::TensorProblem p;
      p.x = x.data();
      p.y = y.data();
      p.params = model_.params().data();
      p.partials = partials_.data();
      p.ld = width_;
      p.rows = rows_;
      p.block = block_;
      p.blocks = blocks_;
      p.n_in = model_.inputs();
      p.H = model_.widths()[1];
      p.NO = model_.outputs();
      p.w0off = static_cast<std::int64_t>(model_.weight_offset(0));
      p.b0off = static_cast<std::int64_t>(model_.bias_offset(0));
      p.w1off = static_cast<std::int64_t>(model_.weight_offset(1));
      p.b1off = static_cast<std::int64_t>(model_.bias_offset(1));
      p.scale = scale;
      p.act = model_.activation();
      p.window = window;
      p.kernel = static_cast<backend::TensorKernel>(tensor_kernel_);
      backend::compute_tensor(space, p, group_);
      return;
    }
#endif
    (void)space, (void)x, (void)y, (void)scale, (void)window;
    throw InputError("dpmlp: " + tensor_unsupported(model_));
  }

 private:
  // Out[rows x n] = In[rows x k] * op(Wt), block by block: the full blocks in one batched call, the short
  // tail block in another. Wt is shared by all blocks (stride 0).
  void blocked_gemm(const ExecSpace& space, linalg::Op op_in, linalg::Op op_w, int n, int k, const Scalar* in,
                    int ld_in, const Scalar* w, int ld_w, std::int64_t stride_w, Scalar* out, int ld_out,
                    std::int64_t stride_out, std::int64_t stride_in) const {
    const std::int64_t full = rows_ / block_, tail = rows_ - full * block_;
    linalg::BatchedGemm<Scalar> g;
    g.op_a = op_in;
    g.op_b = op_w;
    g.n = n;
    g.k = k;
    g.a = in;
    g.lda = ld_in;
    g.stride_a = stride_in;
    g.b = w;
    g.ldb = ld_w;
    g.stride_b = stride_w;
    g.c = out;
    g.ldc = ld_out;
    g.stride_c = stride_out;
    g.m = static_cast<int>(block_);
    g.batch = full;
    linalg::gemm(space, gemm_, g);
    if (tail > 0) {
      g.m = static_cast<int>(tail);
      g.batch = 1;
      g.a = in + full * stride_in;
      g.c = out + full * stride_out;
      linalg::gemm(space, gemm_, g);
    }
  }

  // partials[b][off .. off + n_in*n_o) = A[block b]^T * D[block b]
  void blocked_weight_grad(const ExecSpace& space, int n_in, int n_o, const Scalar* a, const Scalar* d, int ld_d,
                           std::size_t off) const {
    const std::int64_t full = rows_ / block_, tail = rows_ - full * block_;
    linalg::BatchedGemm<Scalar> g;
    g.op_a = linalg::Op::T;
    g.op_b = linalg::Op::N;
    g.m = n_in;
    g.n = n_o;
    g.a = a;
    g.lda = n_in;
    g.stride_a = block_ * n_in;
    g.b = d;
    g.ldb = ld_d;
    g.stride_b = block_ * ld_d;
    g.c = partials_.data() + off;
    g.ldc = n_o;
    g.stride_c = width_;
    g.k = static_cast<int>(block_);
    g.batch = full;
    linalg::gemm(space, gemm_, g);
    if (tail > 0) {
      g.k = static_cast<int>(tail);
      g.batch = 1;
      g.a = a + full * g.stride_a;
      g.b = d + full * g.stride_b;
      g.c = partials_.data() + full * width_ + off;
      linalg::gemm(space, gemm_, g);
    }
  }

  Mlp<Scalar, memory_space> model_;
  std::int64_t rows_ = 0, block_ = 1, blocks_ = 0, width_ = 0;
  int group_ = 1;  // blocks a row of partials_ sums
  linalg::Backend gemm_ = linalg::Backend::portable;
  Engine kind_ = Engine::layered;  // never automatic
  int tensor_kernel_ = 0;           // see tensor_kernel()
  FusedLayout layout_;             // the fused kernel's shape (Engine::fused only)
  matrix partials_;
  std::vector<matrix> acts_;
  matrix delta_[2];
  Kokkos::View<Scalar*, memory_space> row_scratch_;
};

}  // namespace detail
}  // namespace dpmlp
