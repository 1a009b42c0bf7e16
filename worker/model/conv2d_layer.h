// Forward and backward of a 2-D convolution on NCHW float images, through
// im2col and OpenBLAS sgemm: stride 1, an odd square kernel, 'same' zero
// padding of (kernel - 1) / 2 on every side, so the output has the input's
// height and width. Kernel layout [out][in][kernel][kernel] as in ModelSpec's
// ConvLayerSpec (cross-correlation: output (o, y, x) sums
// w(o, i, ky, kx) * x(i, y + ky - pad, x + kx - pad) over in-range pixels).
//
// Shapes: x and dx are images x in_channels x height x width, y and dy are
// images x out_channels x height x width, w is out_channels x in_channels x
// kernel x kernel, b is out_channels. Span sizes must match the shape exactly
// (checked: a mismatch is a programmer error); outputs must not alias inputs
// or the workspace.
#ifndef CSERPS_WORKER_MODEL_CONV2D_LAYER_H_
#define CSERPS_WORKER_MODEL_CONV2D_LAYER_H_

#include <cstddef>

#include "absl/types/span.h"
#include "common/model_spec.h"

namespace cserps {

struct Conv2dShape {
  size_t images = 0;  // > 0
  size_t in_channels = 0;
  size_t height = 0;
  size_t width = 0;
  size_t out_channels = 0;
  size_t kernel = 0;  // odd
};

// Floats of caller-owned workspace that Conv2dForward and Conv2dBackward
// need for `shape`: the im2col matrix (in_channels * kernel^2 rows,
// images * height * width columns) plus a copy of the output in
// channel-major order, both for all of shape.images at once. Callers bound it
// by calling with fewer images at a time.
size_t Conv2dWorkspaceSize(const Conv2dShape& shape);

// The shape of a model's conv stage `conv` on `images` images.
Conv2dShape StageShape(const ConvLayerSpec& conv, size_t images);

// y = conv(x, w) + b (y overwritten). workspace.size() >=
// Conv2dWorkspaceSize(shape); its contents are scratch.
void Conv2dForward(const Conv2dShape& shape, absl::Span<const float> x,
                   absl::Span<const float> w, absl::Span<const float> b,
                   absl::Span<float> y, absl::Span<float> workspace);

// Given dy = dL/dy: ADDS dL/dw into dw and dL/db into db (so that a batch
// can be processed in groups of images; zero them before the first group),
// and overwrites dx with dL/dx unless dx is empty, which skips it (the first
// layer needs no input gradient).
void Conv2dBackward(const Conv2dShape& shape, absl::Span<const float> x,
                    absl::Span<const float> w, absl::Span<const float> dy,
                    absl::Span<float> dw, absl::Span<float> db,
                    absl::Span<float> dx, absl::Span<float> workspace);

}  // namespace cserps

#endif  // CSERPS_WORKER_MODEL_CONV2D_LAYER_H_
