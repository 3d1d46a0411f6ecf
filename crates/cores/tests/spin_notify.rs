//! Notifications from handlers in the worker process: they come back in
//! order with the message's outcome, and a handler that notifies more
//! than `MAX_NOTIFICATIONS` times for one message has the rest counted and
//! dropped, its message unaffected (the node's memory stays bounded).

use crate::support::cc;

use std::path::Path;

use corefarm_cores::spin::{BudgetSpec, HandlerSet, Mode, Outcome, Rule, Ruleset};
use corefarm_cores::worker::{HandlerWorker, MAX_NOTIFICATIONS};
use corefarm_cores::{LoadOptions, WorkerCommand};
use corefarm_toolchain::{require_tool, Tool};

/// `chatty`: its tail notifies word 1 times (each the counter, u32), then
/// emits "done".
const CHATTY: &str = r#"
#include <corefarm/spin.h>
#include <string.h>

int chatty_head(const cf_spin_args *a, const cf_spin_ops *ops) {
    (void)ops;
    if (a->len < 8) return 1;
    memcpy(a->scratch, a->data + 4, 4);
    return 0;
}

int chatty_tail(const cf_spin_args *a, const cf_spin_ops *ops) {
    uint32_t n;
    memcpy(&n, a->scratch, 4);
    for (uint32_t i = 0; i < n; i++)
        if (ops->notify(ops->ctx, (const uint8_t *)&i, sizeof i) != 0) return 2;
    return ops->emit(ops->ctx, (const uint8_t *)"done", 4);
}
"#;

fn compile(dir: &Path) -> Vec<u8> {
    cc::from_text(dir, "chatty", CHATTY, "c11", &[])
}

#[test]
fn notifications_come_back_in_order_and_bounded_per_message() {
    if !require_tool(Tool::Cxx, "notifications_in_the_worker") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let set = HandlerSet {
        name: "chatty".into(),
        ruleset: Ruleset {
            mode: Mode::And,
            rules: vec![Rule {
                index: 0,
                mask: u32::MAX,
                start: 8,
                end: 8,
            }],
        },
        budgets: BudgetSpec::default(),
        result_type: None,
    };
    let opts = LoadOptions {
        worker: WorkerCommand::Program(env!("CARGO_BIN_EXE_corefarm-core-worker").into()),
        ..LoadOptions::default()
    };
    let mut w = HandlerWorker::start(&compile(dir.path()), vec![set], 2, &opts).unwrap();
    let extra = 44u32;
    for (id, n) in [(1u32, 3u32), (2, MAX_NOTIFICATIONS as u32 + extra), (3, 0)] {
        let msg: Vec<u8> = [8u32, n, 0, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let ctx = w.select(&msg).expect("chatty matches");
        let done = w.run(ctx, id, &msg, 4096);
        assert_eq!(done.outcome, Outcome::Result(b"done".to_vec()), "id {id}");
        let kept = n.min(MAX_NOTIFICATIONS as u32);
        let want: Vec<Vec<u8>> = (0..kept).map(|i| i.to_le_bytes().to_vec()).collect();
        assert_eq!(
            done.notifications, want,
            "id {id}: the first ones, in order"
        );
        assert_eq!(done.notifications_dropped, u64::from(n - kept), "id {id}");
    }
}
