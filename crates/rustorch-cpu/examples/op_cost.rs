//! The executor's cost per small op, with the system allocator: profile it
//! with `perf record`. `op_cost_block_cache` runs the same loop over
//! `block_cache::BlockCache`, the allocator rustorch-cli uses.
//! usage: cargo run --release -p rustorch-cpu --example op_cost [ITERATIONS]

#[path = "shared/op_cost_loop.rs"]
mod op_cost_loop;

fn main() -> rustorch_core::Result<()> {
    op_cost_loop::run()
}
