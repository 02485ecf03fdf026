// SPDX-License-Identifier: Apache-2.0
/* Loads libflashdecode at run time with dlopen, checks that its major version
 * is the one this program was written for, and runs a small CPU decode.
 * Build: cc dlopen_consumer.c -I<include dir> -ldl
 * Run:   ./dlopen_consumer [path/to/libflashdecode.so.0]   (default: the SONAME) */
#include <dlfcn.h>
#include <flashdecode.h>
#include <stdio.h>
#include <string.h>

#define STR_(x) #x
#define STR(x) STR_(x)
#define SONAME "libflashdecode.so." STR(FD_VERSION_MAJOR)

typedef unsigned (*version_number_fn)(void);
typedef const char *(*version_string_fn)(void);
typedef size_t (*options_init_fn)(fd_options *, size_t);
typedef size_t (*args_init_fn)(fd_decode_args *, size_t);
typedef fd_status (*create_fn)(fd_handle **, const fd_options *);
typedef fd_status (*decode_fn)(fd_handle *, const fd_decode_args *, fd_cuda_stream);
typedef fd_status (*destroy_fn)(fd_handle *);
typedef size_t (*last_error_fn)(char *, size_t);

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : SONAME;
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen(%s): %s\n", path, dlerror());
    return 1;
  }
  /* POSIX allows converting dlsym's object pointer to a function pointer. */
#define LOAD(type, name)                    \
  type name = (type)dlsym(lib, #name);      \
  if (!name) {                              \
    fprintf(stderr, "missing %s\n", #name); \
    return 1;                               \
  }
  LOAD(version_number_fn, fd_version_number)
  LOAD(version_string_fn, fd_version_string)
  LOAD(options_init_fn, fd_options_init)
  LOAD(args_init_fn, fd_decode_args_init)
  LOAD(create_fn, fd_create)
  LOAD(decode_fn, fd_decode)
  LOAD(destroy_fn, fd_destroy)
  LOAD(last_error_fn, fd_last_error_message)

  const unsigned loaded = fd_version_number();
  if (loaded / 10000 != FD_VERSION_MAJOR) {
    fprintf(stderr, "%s is version %s, this program needs major version %d\n", path, fd_version_string(),
            FD_VERSION_MAJOR);
    return 1;
  }

  enum { N = 100, D = 16 };
  static float q[D], k[N][D], v[N][D], out[D];
  for (int j = 0; j < N; ++j)
    for (int d = 0; d < D; ++d) {
      k[j][d] = (float)((j * 31 + d * 7) % 13) / 13.0f;
      v[j][d] = (float)j; /* out[d] is then a softmax-weighted mean of 0..N-1 */
    }
  for (int d = 0; d < D; ++d) q[d] = 0.25f;

  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  fd_handle *handle = NULL;
  fd_decode_args args;
  fd_decode_args_init(&args, sizeof args);
  const fd_tensor tq = {q, FD_DTYPE_F32, 4, {1, 1, 1, D}, {D, D, D, 1}};
  const fd_tensor tk = {k, FD_DTYPE_F32, 4, {1, N, 1, D}, {N * D, D, D, 1}};
  const fd_tensor tv = {v, FD_DTYPE_F32, 4, {1, N, 1, D}, {N * D, D, D, 1}};
  const fd_tensor to = {out, FD_DTYPE_F32, 4, {1, 1, 1, D}, {D, D, D, 1}};
  args.q = tq;
  args.k = tk;
  args.v = tv;
  args.out = to;
  fd_status status = fd_create(&handle, &options);
  if (status == FD_SUCCESS) status = fd_decode(handle, &args, NULL);
  if (status != FD_SUCCESS) {
    char message[256];
    fd_last_error_message(message, sizeof message);
    fprintf(stderr, "flashdecode: %s\n", message);
    return 1;
  }
  fd_destroy(handle);
  const int ok = out[0] > 0.0f && out[0] < (float)(N - 1) && out[0] == out[D - 1];
  printf("loaded %s version %s: out[0] = %f (%s)\n", path, fd_version_string(), out[0], ok ? "ok" : "WRONG");
  dlclose(lib);
  return ok ? 0 : 1;
}
