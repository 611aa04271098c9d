/** Small dense linear algebra in float64, used only when building weights (not on hot paths). */

/**
 * Eigen-decomposition of a symmetric n x n matrix (row-major) by cyclic Jacobi rotations.
 * Returns eigenvalues in descending order and the matching eigenvectors as columns of `vectors`
 * (row-major n x n).
 */
export function symmetricEigen(m: Float64Array, n: number): { values: Float64Array; vectors: Float64Array } {
  const a = Float64Array.from(m);
  const v = new Float64Array(n * n);
  for (let i = 0; i < n; i++) v[i * n + i] = 1;
  for (let sweep = 0; sweep < 100; sweep++) {
    let off = 0;
    for (let p = 0; p < n; p++) for (let q = p + 1; q < n; q++) off += a[p * n + q]! ** 2;
    if (off < 1e-22) break;
    for (let p = 0; p < n; p++) {
      for (let q = p + 1; q < n; q++) {
        const apq = a[p * n + q]!;
        if (Math.abs(apq) < 1e-300) continue;
        const app = a[p * n + p]!;
        const aqq = a[q * n + q]!;
        const theta = (aqq - app) / (2 * apq);
        const t = Math.sign(theta || 1) / (Math.abs(theta) + Math.sqrt(theta * theta + 1));
        const c = 1 / Math.sqrt(t * t + 1);
        const s = t * c;
        for (let k = 0; k < n; k++) {
          const akp = a[k * n + p]!;
          const akq = a[k * n + q]!;
          a[k * n + p] = c * akp - s * akq;
          a[k * n + q] = s * akp + c * akq;
        }
        for (let k = 0; k < n; k++) {
          const apk = a[p * n + k]!;
          const aqk = a[q * n + k]!;
          a[p * n + k] = c * apk - s * aqk;
          a[q * n + k] = s * apk + c * aqk;
        }
        for (let k = 0; k < n; k++) {
          const vkp = v[k * n + p]!;
          const vkq = v[k * n + q]!;
          v[k * n + p] = c * vkp - s * vkq;
          v[k * n + q] = s * vkp + c * vkq;
        }
      }
    }
  }
  const order = Array.from({ length: n }, (_, i) => i).sort((x, y) => a[y * n + y]! - a[x * n + x]! || x - y);
  const values = new Float64Array(n);
  const vectors = new Float64Array(n * n);
  order.forEach((src, dst) => {
    values[dst] = a[src * n + src]!;
    for (let k = 0; k < n; k++) vectors[k * n + dst] = v[k * n + src]!;
  });
  return { values, vectors };
}

/** Solves `M X = B` for symmetric positive definite M (n x n) and B (n x m), row-major, by Cholesky. */
export function choleskySolve(m: Float64Array, n: number, b: Float64Array, cols: number): Float64Array {
  const l = new Float64Array(n * n);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j <= i; j++) {
      let s = m[i * n + j]!;
      for (let k = 0; k < j; k++) s -= l[i * n + k]! * l[j * n + k]!;
      if (i === j) l[i * n + i] = Math.sqrt(Math.max(s, 1e-12));
      else l[i * n + j] = s / l[j * n + j]!;
    }
  }
  const x = Float64Array.from(b);
  for (let c = 0; c < cols; c++) {
    for (let i = 0; i < n; i++) {
      let s = x[i * cols + c]!;
      for (let k = 0; k < i; k++) s -= l[i * n + k]! * x[k * cols + c]!;
      x[i * cols + c] = s / l[i * n + i]!;
    }
    for (let i = n - 1; i >= 0; i--) {
      let s = x[i * cols + c]!;
      for (let k = i + 1; k < n; k++) s -= l[k * n + i]! * x[k * cols + c]!;
      x[i * cols + c] = s / l[i * n + i]!;
    }
  }
  return x;
}

/** Standard deviation of the values of `a` (population). */
export function stddev(a: ArrayLike<number>): number {
  let s = 0;
  let s2 = 0;
  const n = a.length;
  for (let i = 0; i < n; i++) {
    s += a[i]!;
    s2 += a[i]! * a[i]!;
  }
  const mean = s / n;
  return Math.sqrt(Math.max(0, s2 / n - mean * mean));
}
