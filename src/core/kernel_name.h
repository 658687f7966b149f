// The name of the kernel the calling thread last launched (dsa::last_kernel_name): every CUDA
// launcher sets it with a string literal; DSA_DISPATCH clears it before each op.
#pragma once

namespace dsa {
namespace core {

void set_last_kernel_name(const char* name);  // a string literal (never freed); nullptr is ""

}  // namespace core
}  // namespace dsa
