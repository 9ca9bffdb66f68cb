//! Convolution and pooling, with PyTorch's argument conventions.

use super::Tensor;
use crate::error::Result;
use crate::op::{Conv2dParams, Op, Pool2dParams};

impl Default for Conv2dParams {
    /// Stride 1, no padding, no dilation, one group: PyTorch's defaults.
    fn default() -> Self {
        Conv2dParams {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

impl Conv2dParams {
    pub fn new(stride: [usize; 2], padding: [usize; 2], dilation: [usize; 2], groups: usize) -> Self {
        Conv2dParams {
            stride,
            padding,
            dilation,
            groups,
        }
    }
    pub fn with_stride(self, stride: [usize; 2]) -> Self {
        Conv2dParams { stride, ..self }
    }
    pub fn with_padding(self, padding: [usize; 2]) -> Self {
        Conv2dParams { padding, ..self }
    }
    pub fn with_dilation(self, dilation: [usize; 2]) -> Self {
        Conv2dParams { dilation, ..self }
    }
    pub fn with_groups(self, groups: usize) -> Self {
        Conv2dParams { groups, ..self }
    }
}

impl Pool2dParams {
    /// A `kernel`-sized window moving by its own size (PyTorch's default
    /// stride), without padding.
    pub fn new(kernel: [usize; 2]) -> Self {
        Pool2dParams {
            kernel,
            stride: kernel,
            padding: [0, 0],
        }
    }
    pub fn with_stride(self, stride: [usize; 2]) -> Self {
        Pool2dParams { stride, ..self }
    }
    pub fn with_padding(self, padding: [usize; 2]) -> Self {
        Pool2dParams { padding, ..self }
    }
}

fn with_bias<'a>(x: &'a Tensor, w: &'a Tensor, bias: Option<&'a Tensor>) -> Vec<&'a Tensor> {
    let mut v = vec![x, w];
    v.extend(bias);
    v
}

impl Tensor {
    /// 1-D convolution (cross-correlation, as PyTorch): input [N, C, L],
    /// weight [O, C/groups, K], optional bias [O]; output [N, O, L_out].
    pub fn conv1d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        stride: usize,
        padding: usize,
        dilation: usize,
        groups: usize,
    ) -> Result<Tensor> {
        let op = Op::Conv1d {
            stride,
            padding,
            dilation,
            groups,
            has_bias: bias.is_some(),
        };
        self.run1(&op, &with_bias(self, weight, bias))
    }

    /// 2-D convolution: input [N, C, H, W], weight [O, C/groups, KH, KW],
    /// optional bias [O]; output [N, O, H_out, W_out].
    pub fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, params: Conv2dParams) -> Result<Tensor> {
        let op = Op::Conv2d {
            params,
            has_bias: bias.is_some(),
        };
        self.run1(&op, &with_bias(self, weight, bias))
    }

    /// 2-D transposed convolution (the gradient of `conv2d` with respect to
    /// its input): input [N, C, H, W], weight [C, O/groups, KH, KW],
    /// optional bias [O]. `output_padding` adds rows and columns on one side
    /// to pick among the output sizes a strided convolution maps to the
    /// same input size.
    pub fn conv_transpose2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        params: Conv2dParams,
        output_padding: [usize; 2],
    ) -> Result<Tensor> {
        let op = Op::ConvTranspose2d {
            params,
            output_padding,
            has_bias: bias.is_some(),
        };
        self.run1(&op, &with_bias(self, weight, bias))
    }

    /// Max over each window of an [N, C, H, W] input; padding counts as -inf.
    pub fn max_pool2d(&self, params: Pool2dParams) -> Result<Tensor> {
        self.run1(&Op::MaxPool2d { params }, &[self])
    }

    /// Mean over each window of an [N, C, H, W] input. With
    /// `count_include_pad` the padding counts as zeros in the divisor.
    pub fn avg_pool2d(&self, params: Pool2dParams, count_include_pad: bool) -> Result<Tensor> {
        self.run1(
            &Op::AvgPool2d {
                params,
                count_include_pad,
            },
            &[self],
        )
    }
}
