//! Tensor methods for convolution and pooling land here with their CPU kernels.
