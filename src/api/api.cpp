// SPDX-License-Identifier: Apache-2.0
// The exported C functions: argument checks, handle lifetime, workspace
// ownership, and dispatch to a backend. No templates and no kernels here.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_set>

#include "api/guard.h"
#include "backend/backend.h"
#include "core/plan.h"
#include "core/problem.h"
#include "core/sized_struct.h"

struct fd_handle {
  // Serialises the calls on this handle (taken through fd::LockedHandle):
  // they share the plan cache, the workspace and the backend's threads.
  mutable std::mutex mutex;
  std::unique_ptr<fd::Backend> backend;
  void *workspace = nullptr;
  size_t workspace_bytes = 0;
  bool workspace_owned = true;  // false: the caller's memory, never freed here
  // The last plan fd_decode made, reused while the shape stays the same.
  bool has_last_plan = false;
  fd::PlanKey last_plan_key;
  fd::Plan last_plan;
};

namespace fd {
namespace {

// Live handles. A destroyed or foreign pointer is recognised without being
// dereferenced, so use-after-destroy is reported instead of crashing.
// Why destroying is safe: a call locks its handle's mutex before dropping the
// shared lock it found the handle under, so once fd_destroy has erased the
// handle (exclusively), no call waits for it and at most one holds it;
// fd_destroy waits for that one, registry released, then deletes. Lock order
// is registry then handle, and no holder of a handle waits for the registry.
class HandleRegistry {
 public:
  void add(const fd_handle *h) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    live_.insert(h);
  }
  // Whether h was live; afterwards no call can find it.
  bool remove(const fd_handle *h) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    return live_.erase(h) == 1;
  }
  // Locks a live handle's mutex; throws FD_ERROR_INVALID_HANDLE otherwise.
  // Calls on different handles share the registry lock and do not wait for
  // each other.
  std::unique_lock<std::mutex> lock_live(const fd_handle *h) {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    if (live_.count(h) == 0) {
      fail(FD_ERROR_INVALID_HANDLE, "handle %p is not a live handle (destroyed, or not made by fd_create)",
           static_cast<const void *>(h));
    }
    return std::unique_lock<std::mutex>(h->mutex);  // taken before `lock` is released
  }

 private:
  std::shared_mutex mutex_;
  std::unordered_set<const fd_handle *> live_;
};

HandleRegistry &registry() {
  static HandleRegistry *instance = new HandleRegistry;  // never destroyed: usable during exit
  return *instance;
}

// A live handle, locked for one ABI call: every function that uses a handle
// goes through this (fd_destroy aside). Handle is fd_handle or const fd_handle.
template <class Handle>
class LockedHandle {
 public:
  explicit LockedHandle(Handle *handle) : handle_(checked(handle)), lock_(registry().lock_live(handle)) {}
  Handle &operator*() const { return *handle_; }

 private:
  static Handle *checked(Handle *handle) {
    if (handle == nullptr) fail(FD_ERROR_NULL_POINTER, "handle is NULL");
    return handle;
  }

  Handle *handle_;
  std::unique_lock<std::mutex> lock_;
};

// A NULL caller gets the defaults; see core/sized_struct.h for older and
// newer callers' structs.
fd_options read_options(const fd_options *caller) {
  fd_options options;
  fd_options_init(&options, sizeof options);
  if (caller == nullptr) return options;
  const size_t required = offsetof(fd_options, backend) + sizeof(caller->backend);
  return read_sized_struct(*caller, options, required, "options", "fd_options");
}

// FD_CHECK_* flags from FLASHDECODE_CHECKS: a comma-separated list of
// check names ("contents"), added to every handle's options so that a
// deployed program can be checked without rebuilding it.
uint32_t checks_from_environment() {
  const char *value = std::getenv("FLASHDECODE_CHECKS");
  if (value == nullptr) return FD_CHECK_NONE;
  uint32_t checks = FD_CHECK_NONE;
  const char *word = value;
  while (*word != '\0') {
    const char *end = std::strchr(word, ',');
    const size_t length = end == nullptr ? std::strlen(word) : static_cast<size_t>(end - word);
    if (length == std::strlen("contents") && std::strncmp(word, "contents", length) == 0) {
      checks |= FD_CHECK_CONTENTS;
    } else if (length != 0 && !(length == std::strlen("none") && std::strncmp(word, "none", length) == 0)) {
      fail(FD_ERROR_INVALID_ARGUMENT,
           "environment: FLASHDECODE_CHECKS=%s: unknown check \"%.*s\" (known: contents, none)", value,
           static_cast<int>(length), word);
    }
    word += length;
    if (*word == ',') ++word;
  }
  return checks;
}

std::unique_ptr<Backend> make_backend(const fd_options &options) {
  if (options.num_threads < 0) {
    fail(FD_ERROR_INVALID_ARGUMENT, "options: num_threads must be >= 0 (0 = all cores), got %d",
         static_cast<int>(options.num_threads));
  }
  if (options.num_threads > FD_MAX_THREADS) {
    fail(FD_ERROR_INVALID_ARGUMENT, "options: num_threads must be at most %d, got %d", FD_MAX_THREADS,
         static_cast<int>(options.num_threads));
  }
  if ((options.checks & ~static_cast<uint32_t>(FD_CHECK_CONTENTS)) != 0) {
    fail(FD_ERROR_INVALID_ARGUMENT, "options: checks has unknown bits 0x%x (known: FD_CHECK_CONTENTS = 0x%x)",
         static_cast<unsigned>(options.checks & ~static_cast<uint32_t>(FD_CHECK_CONTENTS)),
         static_cast<unsigned>(FD_CHECK_CONTENTS));
  }
  const bool check_contents = ((options.checks | checks_from_environment()) & FD_CHECK_CONTENTS) != 0;
  switch (raw_enum_value(options.backend)) {
    case FD_BACKEND_CPU: return make_cpu_backend(options.num_threads, check_contents);
    case FD_BACKEND_CUDA:
      if (options.device < 0) {
        fail(FD_ERROR_INVALID_ARGUMENT, "options: device must be >= 0, got %d", static_cast<int>(options.device));
      }
      return make_cuda_backend(options.device, check_contents);
    case FD_BACKEND_AUTO:
      // A device that passes the probe can still fail to run this build's
      // kernels (e.g. built for sm_90a only, run on an A100): NO_DEVICE from
      // the CUDA backend means the CPU, as documented; other errors stand.
      if (options.device >= 0 && cuda_backend_available(options.device)) {
        try {
          return make_cuda_backend(options.device, check_contents);
        } catch (const Error &e) {
          if (e.status() != FD_ERROR_NO_DEVICE) throw;
        }
      }
      return make_cpu_backend(options.num_threads, check_contents);
  }
  fail(FD_ERROR_INVALID_ARGUMENT, "options: unknown backend %d", raw_enum_value(options.backend));
}

struct PlannedDecode {
  Problem problem;
  Plan plan;
};

Plan plan_for(const fd_handle &h, const Problem &problem) { return h.backend->plan(problem); }

PlannedDecode plan_decode(const fd_handle &h, const fd_decode_args *args) {
  PlannedDecode planned;
  planned.problem = validate_decode_args(args);
  h.backend->check_supported(planned.problem);
  planned.plan = plan_for(h, planned.problem);
  return planned;
}

// Allocating during stream capture is not allowed (and would invalidate the
// capture): say how to reserve ahead instead.
void refuse_growth_during_capture(const fd_handle &h, size_t bytes, fd_cuda_stream stream) {
  if (bytes <= h.workspace_bytes || !h.workspace_owned || !h.backend->stream_is_capturing(stream)) return;
  fail(FD_ERROR_WORKSPACE_TOO_SMALL,
       "workspace: %zu bytes needed, %zu reserved, and the stream is being captured into a CUDA graph, where memory "
       "cannot be allocated: call fd_reserve_workspace with fd_workspace_size's answer before capturing",
       bytes, h.workspace_bytes);
}

// fd_decode's planning: as plan_decode, but reusing the handle's last plan
// when the shape has not changed (the split search is not free, and a
// decode loop repeats one shape). Only fd_decode may call this: it writes
// the handle, which fd_workspace_size must not.
PlannedDecode plan_decode_cached(fd_handle &h, const fd_decode_args *args) {
  PlannedDecode planned;
  planned.problem = validate_decode_args(args);
  h.backend->check_supported(planned.problem);
  const PlanKey key = plan_key(planned.problem);
  if (!h.has_last_plan || !(key == h.last_plan_key)) {
    h.last_plan = plan_for(h, planned.problem);
    h.last_plan_key = key;
    h.has_last_plan = true;
  }
  planned.plan = h.last_plan;
  return planned;
}

void release_owned_workspace(fd_handle &h) noexcept {
  if (h.workspace_owned && h.workspace != nullptr) h.backend->free_workspace(h.workspace);
  h.workspace = nullptr;
  h.workspace_bytes = 0;
  h.workspace_owned = true;
}

// Ensures the workspace holds `bytes`: grows library-owned memory, rejects a
// too-small caller buffer.
void ensure_workspace(fd_handle &h, size_t bytes) {
  if (bytes <= h.workspace_bytes) return;
  if (!h.workspace_owned) {
    fail(FD_ERROR_WORKSPACE_TOO_SMALL, "workspace: %zu bytes needed, the caller's workspace has %zu", bytes,
         h.workspace_bytes);
  }
  void *grown = h.backend->allocate_workspace(bytes);
  try {
    h.backend->prepare_workspace(grown, bytes);
  } catch (...) {
    h.backend->free_workspace(grown);
    throw;
  }
  release_owned_workspace(h);
  h.workspace = grown;
  h.workspace_bytes = bytes;
}

// Fills exactly the caller's struct_size bytes: the library's defaults for
// the fields it knows, zero (the default of every later field) beyond.
template <class Struct>
size_t init_sized(Struct *caller, size_t struct_size, const Struct &defaults) {
  if (caller == nullptr || struct_size < sizeof(size_t)) return sizeof(Struct);
  std::memset(static_cast<void *>(caller), 0, struct_size);
  std::memcpy(static_cast<void *>(caller), &defaults, struct_size < sizeof defaults ? struct_size : sizeof defaults);
  caller->struct_size = struct_size;
  return sizeof(Struct);
}

}  // namespace
}  // namespace fd

extern "C" {

FD_API unsigned fd_version_number(void) { return FD_VERSION_NUMBER; }

FD_API const char *fd_version_string(void) { return FD_VERSION_STRING; }

FD_API size_t fd_options_init(fd_options *options, size_t struct_size) {
  fd_options defaults;
  std::memset(&defaults, 0, sizeof defaults);
  defaults.struct_size = sizeof defaults;
  defaults.backend = FD_BACKEND_AUTO;
  defaults.device = 0;
  defaults.num_threads = 0;
  return fd::init_sized(options, struct_size, defaults);
}

FD_API size_t fd_decode_args_init(fd_decode_args *args, size_t struct_size) {
  fd_decode_args defaults;
  std::memset(&defaults, 0, sizeof defaults);
  defaults.struct_size = sizeof defaults;
  defaults.softmax_scale = 0.0;
  defaults.num_splits = 0;
  defaults.mask = FD_MASK_CAUSAL;
  return fd::init_sized(args, struct_size, defaults);
}

FD_API fd_status fd_create(fd_handle **handle, const fd_options *options) {
  return fd::guarded([&] {
    if (handle == nullptr) fd::fail(FD_ERROR_NULL_POINTER, "handle: the output pointer is NULL");
    *handle = nullptr;
    auto created = std::make_unique<fd_handle>();
    created->backend = fd::make_backend(fd::read_options(options));
    fd::registry().add(created.get());
    *handle = created.release();
  });
}

FD_API fd_status fd_destroy(fd_handle *handle) {
  return fd::guarded([&] {
    if (handle == nullptr) return;
    if (!fd::registry().remove(handle)) {
      fd::fail(FD_ERROR_INVALID_HANDLE, "handle %p is not a live handle (already destroyed?)",
               static_cast<const void *>(handle));
    }
    // No call can find it now; wait for the one that may still hold it.
    { std::lock_guard<std::mutex> in_flight(handle->mutex); }
    fd::release_owned_workspace(*handle);
    delete handle;
  });
}

FD_API fd_status fd_get_backend(const fd_handle *handle, fd_backend *backend) {
  return fd::guarded([&] {
    const fd::LockedHandle<const fd_handle> locked(handle);
    const fd_handle &h = *locked;
    if (backend == nullptr) fd::fail(FD_ERROR_NULL_POINTER, "backend: the output pointer is NULL");
    *backend = h.backend->kind();
  });
}

FD_API fd_status fd_workspace_size(const fd_handle *handle, const fd_decode_args *args, size_t *bytes) {
  return fd::guarded([&] {
    const fd::LockedHandle<const fd_handle> locked(handle);
    const fd_handle &h = *locked;
    if (bytes == nullptr) fd::fail(FD_ERROR_NULL_POINTER, "bytes: the output pointer is NULL");
    *bytes = fd::plan_decode(h, args).plan.workspace_bytes;
  });
}

FD_API size_t fd_plan_info_init(fd_plan_info *info, size_t struct_size) {
  fd_plan_info defaults;
  std::memset(&defaults, 0, sizeof defaults);
  defaults.struct_size = sizeof defaults;
  defaults.kernel = "";
  return fd::init_sized(info, struct_size, defaults);
}

FD_API fd_status fd_describe_plan(const fd_handle *handle, const fd_decode_args *args, fd_plan_info *info) {
  return fd::guarded([&] {
    const fd::LockedHandle<const fd_handle> locked(handle);
    const fd_handle &h = *locked;
    if (info == nullptr) fd::fail(FD_ERROR_NULL_POINTER, "info: the output pointer is NULL");
    const size_t caller_size = info->struct_size;
    if (caller_size < sizeof(size_t)) {
      fd::fail(FD_ERROR_INVALID_ARGUMENT, "info: struct_size is %zu (initialise it with fd_plan_info_init)",
               caller_size);
    }
    const fd::PlannedDecode planned = fd::plan_decode(h, args);
    fd::LaunchSummary launch = h.backend->describe(planned.problem, planned.plan);
    if (planned.problem.batch == 0) {  // fd_decode returns before the backend
      launch.merge = FD_MERGE_NONE;
      launch.launches = 0;
      launch.blocks = 0;
      launch.schedule = FD_SCHEDULE_FIXED;
    }
    fd_plan_info described;
    std::memset(&described, 0, sizeof described);
    described.struct_size = caller_size;
    described.backend = h.backend->kind();
    described.num_splits = launch.device_cut_tokens > 0 ? 0 : planned.plan.num_splits;
    described.split_tokens = launch.device_cut_tokens > 0 ? launch.device_cut_tokens : planned.plan.split_tokens;
    described.workspace_bytes = planned.plan.workspace_bytes;
    described.kernel = launch.kernel;
    described.merge = launch.merge;
    described.launches = launch.launches;
    described.blocks = launch.blocks;
    described.schedule = launch.schedule;
    // A caller compiled against a later header keeps its trailing fields.
    std::memcpy(static_cast<void *>(info), &described, caller_size < sizeof described ? caller_size : sizeof described);
  });
}

FD_API fd_status fd_reserve_workspace(fd_handle *handle, size_t bytes) {
  return fd::guarded([&] {
    const fd::LockedHandle<fd_handle> locked(handle);
    fd::ensure_workspace(*locked, bytes);
  });
}

FD_API fd_status fd_set_workspace(fd_handle *handle, void *workspace, size_t bytes) {
  return fd::guarded([&] {
    const fd::LockedHandle<fd_handle> locked(handle);
    fd_handle &h = *locked;
    if (workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % fd::kWorkspaceAlignment != 0) {
      fd::fail(FD_ERROR_INVALID_ARGUMENT, "workspace: %p is not aligned to %zu bytes", workspace,
               fd::kWorkspaceAlignment);
    }
    // Sizes no memory block can have: later comparisons and offsets would
    // trust memory that does not exist.
    uintptr_t end = 0;
    if (workspace != nullptr && bytes > fd::kMaxWorkspaceBytes) {
      fd::fail(FD_ERROR_INVALID_ARGUMENT, "workspace: %zu bytes is larger than any memory block can be (at most %zu)",
               bytes, fd::kMaxWorkspaceBytes);
    }
    if (workspace != nullptr && __builtin_add_overflow(reinterpret_cast<uintptr_t>(workspace), bytes, &end)) {
      fd::fail(FD_ERROR_INVALID_ARGUMENT, "workspace: %zu bytes at %p run past the end of the address space", bytes,
               workspace);
    }
    if (workspace != nullptr) h.backend->prepare_workspace(workspace, bytes);
    fd::release_owned_workspace(h);
    if (workspace != nullptr) {
      h.workspace = workspace;
      h.workspace_bytes = bytes;
      h.workspace_owned = false;
    }
  });
}

FD_API fd_status fd_decode(fd_handle *handle, const fd_decode_args *args, fd_cuda_stream stream) {
  return fd::guarded([&] {
    const fd::LockedHandle<fd_handle> locked(handle);
    fd_handle &h = *locked;
    const fd::PlannedDecode planned = fd::plan_decode_cached(h, args);
    if (h.backend->checks_contents()) h.backend->check_contents(planned.problem);
    if (planned.problem.batch == 0) return;  // nothing to compute, nothing to write
    fd::refuse_growth_during_capture(h, planned.plan.workspace_bytes, stream);
    fd::ensure_workspace(h, planned.plan.workspace_bytes);
    h.backend->decode(planned.problem, planned.plan, h.workspace, stream);
  });
}

FD_API size_t fd_merge_args_init(fd_merge_args *args, size_t struct_size) {
  fd_merge_args defaults;
  std::memset(&defaults, 0, sizeof defaults);
  defaults.struct_size = sizeof defaults;
  return fd::init_sized(args, struct_size, defaults);
}

FD_API fd_status fd_merge_states(fd_handle *handle, const fd_merge_args *args, fd_cuda_stream stream) {
  return fd::guarded([&] {
    const fd::LockedHandle<fd_handle> locked(handle);
    const fd::MergeProblem problem = fd::validate_merge_args(args);
    (*locked).backend->merge_states(problem, stream);
  });
}

FD_API size_t fd_append_args_init(fd_append_args *args, size_t struct_size) {
  fd_append_args defaults;
  std::memset(&defaults, 0, sizeof defaults);
  defaults.struct_size = sizeof defaults;
  return fd::init_sized(args, struct_size, defaults);
}

FD_API fd_status fd_append_kv(fd_handle *handle, const fd_append_args *args, fd_cuda_stream stream) {
  return fd::guarded([&] {
    const fd::LockedHandle<fd_handle> locked(handle);
    const fd::AppendProblem problem = fd::validate_append_args(args);
    if (problem.batch == 0 || problem.new_len == 0 || problem.kv_capacity == 0) return;  // nothing to write
    (*locked).backend->append_kv(problem, stream);
  });
}

FD_API fd_status fd_check_contents(fd_handle *handle, fd_cuda_stream stream) {
  return fd::guarded([&] {
    const fd::LockedHandle<fd_handle> locked(handle);
    fd_handle &h = *locked;
    if (!h.backend->checks_contents()) {
      fd::fail(FD_ERROR_INVALID_ARGUMENT,
               "handle: it checks nothing (created without FD_CHECK_CONTENTS in options.checks or "
               "FLASHDECODE_CHECKS=contents in the environment)");
    }
    if (h.backend->stream_is_capturing(stream)) {
      fd::fail(FD_ERROR_INVALID_ARGUMENT,
               "stream: it is being captured into a CUDA graph, where waiting for it would invalidate the capture: "
               "call fd_check_contents after replaying the graph");
    }
    h.backend->wait_and_check_contents(stream);
  });
}

}  // extern "C"

// The first 0.2.0 build exported fd_plan_info_init and fd_describe_plan in
// FLASHDECODE_0, before they moved to their own node, FLASHDECODE_0.2. A
// program linked against that build asks for them in FLASHDECODE_0, so they
// stay there too, as non-default versions of the same code: such programs
// still load, and new links get FLASHDECODE_0.2 (docs/abi.md). ".symver
// name, name@@@node" renames the definition itself to the default version.
// Only in the shared library (CMake defines flashdecode_EXPORTS there): a
// static archive has no version nodes and keeps the plain names.
#if defined(__ELF__) && defined(flashdecode_EXPORTS)
extern "C" {
FD_API size_t fd_plan_info_init_0_2_0(fd_plan_info *info, size_t struct_size)
    __attribute__((alias("fd_plan_info_init")));
FD_API fd_status fd_describe_plan_0_2_0(const fd_handle *handle, const fd_decode_args *args, fd_plan_info *info)
    __attribute__((alias("fd_describe_plan")));
}
__asm__(".symver fd_plan_info_init_0_2_0, fd_plan_info_init@FLASHDECODE_0");
__asm__(".symver fd_describe_plan_0_2_0, fd_describe_plan@FLASHDECODE_0");
__asm__(".symver fd_plan_info_init, fd_plan_info_init@@@FLASHDECODE_0.2");
__asm__(".symver fd_describe_plan, fd_describe_plan@@@FLASHDECODE_0.2");
#endif
