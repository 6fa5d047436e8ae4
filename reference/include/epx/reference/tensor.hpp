// Plain dense containers used by the CPU reference: a vector plus explicit shape.
//
// Every container is row-major and bounds-checked: the reference is a test oracle, so an
// out-of-range index must throw rather than read a neighbour's element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace epx::ref {

namespace detail {
inline std::size_t checked_index(int64_t i, int64_t n, const char* what) {
  if (i < 0 || i >= n) {
    throw std::out_of_range(std::string(what) + ": index " + std::to_string(i) + " outside [0, " + std::to_string(n) +
                            ")");
  }
  return static_cast<std::size_t>(i);
}
}  // namespace detail

// 2-D tensor [rows][cols]; element (i, j) is data[i * cols + j].
template <class T>
struct Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<T> data;

  Matrix() = default;
  Matrix(int64_t num_rows, int64_t num_cols, T fill = T{})
      : rows(num_rows), cols(num_cols), data(static_cast<std::size_t>(num_rows * num_cols), fill) {
    if (num_rows < 0 || num_cols < 0) throw std::invalid_argument("Matrix: negative shape");
  }

  T& at(int64_t i, int64_t j) { return data[offset(i, j)]; }
  const T& at(int64_t i, int64_t j) const { return data[offset(i, j)]; }

  // Row i whole: the row index is checked once, and the span's bounds are the row's.
  std::span<T> row(int64_t i) { return {data.data() + row_offset(i), static_cast<std::size_t>(cols)}; }
  std::span<const T> row(int64_t i) const { return {data.data() + row_offset(i), static_cast<std::size_t>(cols)}; }

  bool operator==(const Matrix&) const = default;

 private:
  std::size_t row_offset(int64_t i) const {
    return detail::checked_index(i, rows, "Matrix row") * static_cast<std::size_t>(cols);
  }
  std::size_t offset(int64_t i, int64_t j) const {
    return row_offset(i) + detail::checked_index(j, cols, "Matrix col");
  }
};

// 3-D tensor [dim0][dim1][dim2]; element (i, j, k) is data[(i * dim1 + j) * dim2 + k].
template <class T>
struct Tensor3 {
  int64_t dim0 = 0;
  int64_t dim1 = 0;
  int64_t dim2 = 0;
  std::vector<T> data;

  Tensor3() = default;
  Tensor3(int64_t d0, int64_t d1, int64_t d2, T fill = T{})
      : dim0(d0), dim1(d1), dim2(d2), data(static_cast<std::size_t>(d0 * d1 * d2), fill) {
    if (d0 < 0 || d1 < 0 || d2 < 0) throw std::invalid_argument("Tensor3: negative shape");
  }

  T& at(int64_t i, int64_t j, int64_t k) { return data[offset(i, j, k)]; }
  const T& at(int64_t i, int64_t j, int64_t k) const { return data[offset(i, j, k)]; }

  bool operator==(const Tensor3&) const = default;

 private:
  std::size_t offset(int64_t i, int64_t j, int64_t k) const {
    const std::size_t a = detail::checked_index(i, dim0, "Tensor3 dim0");
    const std::size_t b = detail::checked_index(j, dim1, "Tensor3 dim1");
    const std::size_t c = detail::checked_index(k, dim2, "Tensor3 dim2");
    return (a * static_cast<std::size_t>(dim1) + b) * static_cast<std::size_t>(dim2) + c;
  }
};

// 2-D tensor with explicit element strides: element (i, j) is data[i * row_stride + j * col_stride].
// Row-major is (cols, 1); column-major is (1, rows). Used for FP8 scale inputs, which callers may
// hand over transposed.
template <class T>
struct StridedMatrix {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;
  int64_t col_stride = 0;
  std::vector<T> data;

  static StridedMatrix row_major(int64_t num_rows, int64_t num_cols, T fill = T{}) {
    return StridedMatrix{num_rows, num_cols, num_cols, 1,
                         std::vector<T>(static_cast<std::size_t>(num_rows * num_cols), fill)};
  }
  static StridedMatrix column_major(int64_t num_rows, int64_t num_cols, T fill = T{}) {
    return StridedMatrix{num_rows, num_cols, 1, num_rows,
                         std::vector<T>(static_cast<std::size_t>(num_rows * num_cols), fill)};
  }

  T& at(int64_t i, int64_t j) { return data[offset(i, j)]; }
  const T& at(int64_t i, int64_t j) const { return data[offset(i, j)]; }

 private:
  std::size_t offset(int64_t i, int64_t j) const {
    detail::checked_index(i, rows, "StridedMatrix row");
    detail::checked_index(j, cols, "StridedMatrix col");
    const int64_t flat = i * row_stride + j * col_stride;
    return detail::checked_index(flat, static_cast<int64_t>(data.size()), "StridedMatrix storage");
  }
};

}  // namespace epx::ref
