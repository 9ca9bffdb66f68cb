//! Tensor methods for this op family land here with their CPU kernels.
