#pragma once
// The CUDA emulator's library types (../emulator.h): the data types and library properties that
// src/cuda/ names to cuBLASLt and cuSPARSELt, with the toolkit's values.
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_8I = 3, CUDA_R_32I = 10, CUDA_R_16BF = 14 };
typedef cudaDataType_t cudaDataType;
enum libraryPropertyType { MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL };
