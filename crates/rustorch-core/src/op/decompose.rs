//! Fused ops as sequences of simpler ones, so that a device without the
//! fused kernel still runs the op where its inputs are, instead of the
//! executor moving everything to another device.

use super::{BinaryOp, CpuHints, GateActivation, Op};

/// Where a step (or the whole decomposition's output) takes a value from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepValue {
    /// The fused op's input at this index.
    Input(usize),
    /// Output `index` of an earlier step.
    Output { step: usize, index: usize },
}

/// One op of a decomposition and its inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub op: Op,
    pub inputs: Vec<StepValue>,
}

/// A fused op as steps, and which step outputs are its outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Decomposition {
    pub steps: Vec<Step>,
    pub outputs: Vec<StepValue>,
}

impl Op {
    /// The same computation as simpler ops, giving the same values (the
    /// fused ops promise this: see each one's documentation); `None` for
    /// ops that are not fused.
    pub fn decompose(&self) -> Option<Decomposition> {
        use StepValue::{Input, Output};
        match self {
            Op::QMatMulGated { qtypes, act } => Some(Decomposition {
                steps: vec![
                    Step {
                        op: Op::QMatMuls {
                            qtypes: qtypes.to_vec(),
                        },
                        inputs: vec![Input(0), Input(1), Input(2)],
                    },
                    Step {
                        op: match act {
                            GateActivation::SwiGlu => Op::SwiGlu,
                            GateActivation::GeGlu => Op::GeGlu,
                        },
                        inputs: vec![Output { step: 0, index: 0 }, Output { step: 0, index: 1 }],
                    },
                ],
                outputs: vec![Output { step: 1, index: 0 }],
            }),
            Op::QMatMuls { qtypes } => Some(Decomposition {
                steps: qtypes
                    .iter()
                    .enumerate()
                    .map(|(i, &qtype)| Step {
                        op: Op::QMatMul {
                            qtype,
                            cpu: CpuHints::default(),
                        },
                        inputs: vec![Input(0), Input(i + 1)],
                    })
                    .collect(),
                outputs: (0..qtypes.len()).map(|step| Output { step, index: 0 }).collect(),
            }),
            Op::AddRmsNorm { eps } => Some(Decomposition {
                steps: vec![
                    Step {
                        op: Op::Binary(BinaryOp::Add),
                        inputs: vec![Input(0), Input(1)],
                    },
                    Step {
                        op: Op::RmsNorm {
                            eps: *eps,
                            has_weight: true,
                        },
                        inputs: vec![Output { step: 0, index: 0 }, Input(2)],
                    },
                ],
                outputs: vec![Output { step: 0, index: 0 }, Output { step: 1, index: 0 }],
            }),
            _ => None,
        }
    }
}
