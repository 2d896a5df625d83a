// FlashInfer's host planners (MLAPlan, PrefillSM90Plan) write a step's int32 index arrays into one
// device buffer and return each array's byte offset in it; the kernels' Params take one pointer per
// array. point_at_plan sets each listed Params field to the buffer's base plus that array's offset,
// so the two FlashInfer kernels in this folder fill their index pointers the same way.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

namespace klinear::cuda {

template <class Params>
using PlanArray = std::pair<int32_t* Params::*, int64_t>;  // (field, byte offset in the plan buffer)

template <class Params>
void point_at_plan(Params& p, void* plan, std::initializer_list<PlanArray<std::type_identity_t<Params>>> arrays) {
  for (const auto& [field, offset] : arrays) p.*field = reinterpret_cast<int32_t*>(static_cast<char*>(plan) + offset);
}

}  // namespace klinear::cuda
