// The CUDA emulator's own rules (src/cuda/emulator/), against plain loops: thread and block
// indices, block barriers, warp shuffles, dynamic shared memory, a barrier some threads cannot
// reach (the launch fails naming the block), ldmatrix's fragments, misaligned 16-byte accesses,
// and the device memory budget.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

namespace emu = sinter::cuda::emulator;

namespace {

void run(dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
  emu::launch(grid, block, smem, nullptr, body);
}

}  // namespace

TEST(CudaEmulator, EveryThreadOfEveryBlockRunsOnceWithItsIndices) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  std::vector<int> seen(size_t(grid.x * grid.y * grid.z * block.x * block.y * block.z), 0);
  run(grid, block, 0, [&] {
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    ++seen[b * blockDim.x * blockDim.y * blockDim.z + t];
  });
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int s : seen) EXPECT_EQ(s, 1);
}

TEST(CudaEmulator, ABarrierOrdersSharedWritesBeforeReads) {
  const int n = 256;
  std::vector<int> out(n * 2, -1);
  run(2, n, sizeof(int) * n, [&] {
    int* s = static_cast<int*>(emu::dynamic_shared());
    s[threadIdx.x] = int(threadIdx.x + 1000 * blockIdx.x);
    __syncthreads();
    out[blockIdx.x * n + threadIdx.x] = s[(threadIdx.x + 1) % n];  // written by the next thread
  });
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < n; ++t) EXPECT_EQ(out[b * n + t], (t + 1) % n + 1000 * b);
}

TEST(CudaEmulator, XorShufflesSumAWarpAndReadTheirPartnersLane) {
  const int n = 96;  // three warps
  std::vector<double> sums(n), partners(n);
  run(1, n, 0, [&] {
    double v = double(threadIdx.x) * 0.5;
    partners[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 5);
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    sums[threadIdx.x] = v;
  });
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int t = 0; t < n; ++t) {
    const int w = t / 32 * 32;
    double want = 0;
    for (int l = 0; l < 32; ++l) want += (w + l) * 0.5;
    EXPECT_EQ(sums[size_t(t)], want) << t;
    EXPECT_EQ(partners[size_t(t)], double(w + ((t % 32) ^ 5)) * 0.5) << t;
  }
}

TEST(CudaEmulator, ThreadsThatReturnNoLongerHoldABarrier) {
  std::vector<int> out(64, 0);
  run(1, 64, 0, [&] {
    if (threadIdx.x >= 40) return;
    __syncthreads();
    out[threadIdx.x] = 1;
  });
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(std::accumulate(out.begin(), out.end(), 0), 40);
}

TEST(CudaEmulator, ABarrierSomeThreadsCannotReachFailsTheLaunchNamingTheBlock) {
  run(dim3(2, 1, 1), 64, 0, [&] {
    if (blockIdx.x == 1 && threadIdx.x < 16) __syncthreads();  // the rest of warp 0 waits for them below
    else __syncwarp();
  });
  const cudaError_t e = cudaGetLastError();
  EXPECT_EQ(e, cudaErrorLaunchFailure);
  const std::string msg = cudaGetErrorString(e);
  EXPECT_NE(msg.find("deadlocked in block (1, 0, 0)"), std::string::npos) << msg;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once
  int x = 0;
  run(1, 32, 0, [&] { atomicAdd(&x, 1); });  // the next launch works
  EXPECT_EQ(x, 32);
}

TEST(CudaEmulator, AFullMaskShuffleAfterLanesReturnedFailsTheLaunch) {
  std::vector<float> out(32, 0.0f);
  run(1, 32, 0, [&] {
    if (threadIdx.x >= 24) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  });
  const cudaError_t e = cudaGetLastError();
  EXPECT_EQ(e, cudaErrorLaunchFailure);
  const std::string msg = cudaGetErrorString(e);
  EXPECT_NE(msg.find("after 8 of the warp's lanes returned"), std::string::npos) << msg;
  run(1, 32, 0, [&] {
    if (threadIdx.x >= 24) return;
    out[threadIdx.x] = __shfl_xor_sync(0x00ffffffu, 2.0f, 1);  // the lanes that remain, named
  });
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(out[0], 2.0f);
}

// ldmatrix.x4 as PTX documents it: in shared memory four 8 x 8 matrices of 16-bit values coding
// (matrix, row, column), rows 24 elements apart; lane l names row l % 8 of matrix l / 8, and its
// register m holds matrix m's (row l / 4, columns 2 (l % 4) + {0, 1}), or transposed (rows
// 2 (l % 4) + {0, 1}, column l / 4), the lower index in the low half. A row off 16 bytes fails.
TEST(CudaEmulator, LdmatrixGivesEachLaneItsMatricesElementsAndRefusesAnUnalignedRow) {
  constexpr int kLd = 24;
  auto code = [](int m, int r, int c) { return uint32_t(m * 64 + r * 8 + c); };
  for (const bool trans : {false, true}) {
    std::vector<uint32_t> got(32 * 4, 0);
    run(1, 32, sizeof(uint16_t) * 32 * kLd, [&] {
      auto* s = static_cast<uint16_t*>(emu::dynamic_shared());
      const int l = int(threadIdx.x);
      for (int c = 0; c < 8; ++c) s[l * kLd + c] = uint16_t(code(l / 8, l % 8, c));  // lane l writes its own row
      __syncthreads();
      emu::ldmatrix_x4(&got[size_t(l) * 4], s + l * kLd, trans);
    });
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    for (int l = 0; l < 32; ++l)
      for (int m = 0; m < 4; ++m) {
        const int g = l / 4, t = l % 4;
        const uint32_t lo = trans ? code(m, 2 * t, g) : code(m, g, 2 * t), hi = trans ? code(m, 2 * t + 1, g) : code(m, g, 2 * t + 1);
        EXPECT_EQ(got[size_t(l) * 4 + size_t(m)], lo | hi << 16) << "lane " << l << " register " << m << (trans ? " transposed" : "");
      }
  }
  uint32_t r[4];
  run(1, 32, 32 * 32, [&] { emu::ldmatrix_x4(r, static_cast<uint16_t*>(emu::dynamic_shared()) + 1 + threadIdx.x * 16, false); });
  const cudaError_t e = cudaGetLastError();
  EXPECT_EQ(e, cudaErrorLaunchFailure);
  EXPECT_NE(std::string(cudaGetErrorString(e)).find("ldmatrix"), std::string::npos);
}

// A 16-byte vector access (strided.cuh's load_pack, store_pack) faults on the device off 16 bytes:
// here the launch fails.
TEST(CudaEmulator, ASixteenByteAccessOffSixteenBytesFailsTheLaunch) {
  alignas(16) unsigned char bytes[64] = {};
  run(1, 32, 0, [&] { emu::check_aligned16(bytes + 16 * (threadIdx.x % 4)); });
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  run(1, 32, 0, [&] { emu::check_aligned16(bytes + 8 * (threadIdx.x % 4)); });
  const cudaError_t e = cudaGetLastError();
  EXPECT_EQ(e, cudaErrorLaunchFailure);
  EXPECT_NE(std::string(cudaGetErrorString(e)).find("16-byte access"), std::string::npos);
}

TEST(CudaEmulator, AllocationsPastTheDeviceBudgetFailAndTheBudgetRecovers) {
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, total + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  ASSERT_EQ(cudaMalloc(&p, 1 << 20), cudaSuccess);
  size_t free1 = 0;
  cudaMemGetInfo(&free1, &total);
  EXPECT_EQ(free0 - free1, size_t(1) << 20);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  cudaMemGetInfo(&free1, &total);
  EXPECT_EQ(free1, free0);
}
