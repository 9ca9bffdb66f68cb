//! `op_cost` over `block_cache::BlockCache` (rustorch-cli's allocator).
//! usage: cargo run --release -p rustorch-cpu --example op_cost_block_cache [ITERATIONS]

#[path = "shared/op_cost_loop.rs"]
mod op_cost_loop;

#[global_allocator]
static ALLOC: rustorch_cpu::block_cache::BlockCache = rustorch_cpu::block_cache::BlockCache;

fn main() -> rustorch_core::Result<()> {
    op_cost_loop::run()
}
