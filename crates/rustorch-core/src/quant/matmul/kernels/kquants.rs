//! K-quant (Q2_K .. Q8_K) and IQ4_XS weights against Q8_K activations.

use super::DotFn;
use crate::quant::matmul::Isa;
use crate::quant::QType;

pub(super) fn kernel(_qtype: QType, _isa: Isa) -> Option<DotFn> {
    None
}
