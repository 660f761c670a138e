// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/callback_hooks.hpp: how the trainer calls a callback's optional hooks (callbacks.hpp lists them): each
// hook is detected at compile time, so a callback defines only those it needs.
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

#include "dpmlp/trainer_options.hpp"

namespace dpmlp {

namespace detail {
// Optional hooks, ensmallen-style: a callback has any subset of them.
template <class C, class = void>
struct has_begin : std::false_type {};
template <class C>
struct has_begin<C, std::void_t<decltype(std::declval<C&>().begin_training(std::declval<const TrainInfo&>()))>>
    : std::true_type {};
template <class C, class = void>
struct has_end_step : std::false_type {};
template <class C>
struct has_end_step<C, std::void_t<decltype(std::declval<C&>().end_step(std::declval<const StepInfo&>()))>>
    : std::true_type {};
template <class C, class = void>
struct has_end : std::false_type {};
template <class C>
struct has_end<C, std::void_t<decltype(std::declval<C&>().end_training(std::declval<const TrainResult&>()))>>
    : std::true_type {};

template <class C, class = void>
struct has_begin_step : std::false_type {};
template <class C>
struct has_begin_step<C, std::void_t<decltype(std::declval<C&>().begin_step(std::int64_t()))>> : std::true_type {};
template <class C, class = void>
struct has_begin_epoch : std::false_type {};
template <class C>
struct has_begin_epoch<C, std::void_t<decltype(std::declval<C&>().begin_epoch(std::int64_t()))>> : std::true_type {};
template <class C, class = void>
struct has_end_epoch : std::false_type {};
template <class C>
struct has_end_epoch<C, std::void_t<decltype(std::declval<C&>().end_epoch(std::declval<const EpochInfo&>()))>>
    : std::true_type {};

// A validation callback's hooks (validation.hpp): std::optional<double> validate(const StepInfo&) after every
// step, validate(const EpochInfo&) after every whole epoch; a value is the validation loss of that point.
template <class C, class = void>
struct has_validate_step : std::false_type {};
template <class C>
struct has_validate_step<C, std::void_t<decltype(std::declval<C&>().validate(std::declval<const StepInfo&>()))>>
    : std::true_type {};
template <class C, class = void>
struct has_validate_epoch : std::false_type {};
template <class C>
struct has_validate_epoch<C, std::void_t<decltype(std::declval<C&>().validate(std::declval<const EpochInfo&>()))>>
    : std::true_type {};
// Whether any of the callbacks reports a validation loss (TrainInfo::validation).
template <class... C>
constexpr bool any_validates() {
  return ((has_validate_step<std::decay_t<C>>::value || has_validate_epoch<std::decay_t<C>>::value) || ... || false);
}

// hook(cb) for each callback, in order, that has the hook Has detects.
template <template <class, class> class Has, class Hook, class... C>
void each_with(const Hook& hook, C&... cbs) {
  auto one = [&](auto& cb) {
    if constexpr (Has<std::decay_t<decltype(cb)>, void>::value) hook(cb);
  };
  (one(cbs), ...);
  (void)one;  // an empty pack never calls it
}
// call(): a hook that may ask to stop (returns something convertible to bool) or not (returns void).
template <class Call>
bool asks_to_stop(const Call& call) {
  if constexpr (std::is_void_v<decltype(call())>) {
    call();
    return false;
  } else {
    return static_cast<bool>(call());
  }
}

// begin_step(step) / begin_epoch(epoch): the 1-based number, over all train calls, of what is about to run.
template <class... C>
void call_begin_step(std::int64_t step, C&... cbs) {
  each_with<has_begin_step>([&](auto& cb) { cb.begin_step(step); }, cbs...);
}
template <class... C>
void call_begin_epoch(std::int64_t epoch, C&... cbs) {
  each_with<has_begin_epoch>([&](auto& cb) { cb.begin_epoch(epoch); }, cbs...);
}
template <class... C>
void call_begin(const TrainInfo& info, C&... cbs) {
  each_with<has_begin>([&](auto& cb) { cb.begin_training(info); }, cbs...);
}
// True when any callback asks to stop. Every callback is called, even after one asked.
template <class... C>
bool call_end_step(const StepInfo& info, C&... cbs) {
  bool stop = false;
  each_with<has_end_step>([&](auto& cb) { stop = asks_to_stop([&] { return cb.end_step(info); }) || stop; },
                          cbs...);
  return stop;
}
// True when any callback asks to stop after this epoch. Every callback is called.
template <class... C>
bool call_end_epoch(const EpochInfo& info, C&... cbs) {
  bool stop = false;
  each_with<has_end_epoch>([&](auto& cb) { stop = asks_to_stop([&] { return cb.end_epoch(info); }) || stop; },
                           cbs...);
  return stop;
}
// Every callback's validate hook for this point, in order (each may be collective: every one is called, on
// every rank alike); the value is the first one reported, or empty.
template <class Info, class... C>
std::optional<double> call_validate(const Info& info, C&... cbs) {
  std::optional<double> first;
  auto one = [&](auto& cb) {
    std::optional<double> v = cb.validate(info);
    if (!first) first = v;
  };
  if constexpr (std::is_same<Info, StepInfo>::value) {
    each_with<has_validate_step>(one, cbs...);
  } else {
    each_with<has_validate_epoch>(one, cbs...);
  }
  return first;
}
template <class... C>
void call_end(const TrainResult& r, C&... cbs) {
  each_with<has_end>([&](auto& cb) { cb.end_training(r); }, cbs...);
}
}  // namespace detail

}  // namespace dpmlp
