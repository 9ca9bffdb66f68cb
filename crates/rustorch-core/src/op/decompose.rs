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
            Op::AddRmsNormThen { eps, then } => {
                let mut inputs = vec![Output { step: 0, index: 1 }];
                let n_then = match &**then {
                    Op::QMatMuls { qtypes } => qtypes.len(),
                    Op::QMatMulGated { .. } => 2,
                    _ => return None,
                };
                inputs.extend((0..n_then).map(|i| Input(3 + i)));
                let products = match &**then {
                    Op::QMatMuls { qtypes } => qtypes.len(),
                    _ => 1,
                };
                let mut outputs = vec![Output { step: 0, index: 0 }];
                outputs.extend((0..products).map(|index| Output { step: 1, index }));
                Some(Decomposition {
                    steps: vec![
                        Step {
                            op: Op::AddRmsNorm { eps: *eps },
                            inputs: vec![Input(0), Input(1), Input(2)],
                        },
                        Step {
                            op: (**then).clone(),
                            inputs,
                        },
                    ],
                    outputs,
                })
            }
            _ => None,
        }
    }
}
