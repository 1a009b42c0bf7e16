// CSERPS_VECTOR_CLONES before a function compiles it for AVX2 as well as for
// the build's baseline (SSE2 on x86-64), the CPU picking one as the program
// loads: Debian's binaries run on any x86-64, yet an element-wise loop over
// floats held in cache runs nearly twice as fast 8 floats at a time.
// Only for loops whose every element is computed alone, so the results do
// not depend on the vector width; with -ffp-contract=off (CMakeLists.txt)
// no clone fuses a multiply and an add. Helpers such a function calls must
// be inlined into it (always_inline) to be cloned with it.
#ifndef CSERPS_COMMON_VECTOR_CLONES_H_
#define CSERPS_COMMON_VECTOR_CLONES_H_

// ThreadSanitizer instruments the clones' resolver, which the loader runs
// before the sanitizer is set up: those builds keep the baseline.
#if defined(__SANITIZE_THREAD__)
#define CSERPS_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CSERPS_THREAD_SANITIZER 1
#endif
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(CSERPS_THREAD_SANITIZER)
#define CSERPS_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CSERPS_VECTOR_CLONES
#endif

#endif  // CSERPS_COMMON_VECTOR_CLONES_H_
