//! The process runtime's sandbox helper on its own (`tessera sandbox …` is the same code):
//! what the agent's tests start, since a test binary cannot re-run itself as the helper.

fn main() {
    tessera_agent::sandbox::main(std::env::args_os().skip(1).collect())
}
