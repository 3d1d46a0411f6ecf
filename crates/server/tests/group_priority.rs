//! A user's priority reaches a group's nodes: the
//! client's class rides in the group command through the real server to a
//! node that agreed `group-priority`, and a node that predates it gets the
//! same command without the class (the bytes it has always read).

use crate::common;

use std::net::SocketAddr;

use common::{opts, start, LIMIT};
use corefarm_client::group::{Algorithm, Group, GroupError, GroupOptions};
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::group::{Cmd, GroupCmd, GroupCtl, GroupReply};
use corefarm_smp::{hello::features, DType, Hello, MsgType, ReduceOp};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// A scripted member: joins when told to, answers every command with
/// success, and reports each command's raw command byte and parsed class.
async fn member(
    server: SocketAddr,
    name: &str,
    group_priority: bool,
    seen: mpsc::UnboundedSender<(String, u8, Cmd, u8)>,
) {
    let s = TcpStream::connect(server).await.unwrap();
    let (rd, mut w) = s.into_split();
    let mut hello = Hello::new("node");
    hello.name = Some(name.into());
    hello.features = vec![features::ERROR.into(), features::PEER.into()];
    if group_priority {
        hello.features.push(features::GROUP_PRIORITY.into());
    }
    // Never dialled: the members here do not link to each other.
    hello.peer = Some("127.0.0.1:9".into());
    write_frame(&mut w, hello.to_frame()).await.unwrap();
    let name = name.to_string();
    tokio::spawn(async move {
        let mut r = FrameReader::new(rd, 1 << 20);
        let mut rank = 0;
        while let Ok(Some(f)) = r.read_frame().await {
            match f.ty {
                MsgType::GroupCtl => {
                    if let Ok(GroupCtl::Join {
                        group, rank: me, ..
                    }) = GroupCtl::decode(&f.payload)
                    {
                        rank = me;
                        let joined = GroupCtl::Joined { group, error: None };
                        write_frame(&mut w, joined.to_frame()).await.unwrap();
                    }
                }
                MsgType::GroupCmd => {
                    let byte = f.payload[8];
                    let c = GroupCmd::parse(f.payload).unwrap();
                    let _ = seen.send((name.clone(), byte, c.cmd, c.class));
                    let ok = GroupReply::ok(c.seq, rank, Default::default());
                    write_frame(&mut w, ok.to_frame().unwrap()).await.unwrap();
                }
                _ => {}
            }
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collectives_class_reaches_nodes_that_agreed_and_old_nodes_get_the_plain_command() {
    let s = start(opts()).await;
    let (tx, mut seen) = mpsc::unbounded_channel();
    member(s.nodes, "new", true, tx.clone()).await;
    member(s.nodes, "old", false, tx).await;
    s.wait_status("two free nodes with a hello", |st| {
        st.nodes
            .iter()
            .filter(|n| n.name.is_some() && n.user.is_none())
            .count()
            == 2
    })
    .await;
    let users = s.users.to_string();
    let call = tokio::task::spawn_blocking(move || {
        let mut g = Group::open(&users, GroupOptions::new(2))?;
        assert!(g.priorities(), "the server agreed group-priority");
        g.allreduce(
            "x",
            "s",
            DType::I32,
            ReduceOp::Sum,
            Algorithm::Binomial.class(1),
        )?;
        g.bcast(0, "x", "y", DType::I32, Algorithm::Binomial)?;
        // A class over 7 never leaves the client.
        let e = g.barrier(Algorithm::Binomial.class(8)).unwrap_err();
        assert!(matches!(e, GroupError::Usage(_)), "{e}");
        assert!(e.to_string().contains("priority class 8"), "{e}");
        Ok::<_, GroupError>(())
    });
    tokio::time::timeout(LIMIT, call)
        .await
        .expect("the calls returned")
        .unwrap()
        .unwrap();
    let mut got = Vec::new();
    while let Ok(x) = seen.try_recv() {
        got.push(x);
    }
    got.sort_by(|a, b| (a.2 as u8, &a.0).cmp(&(b.2 as u8, &b.0)));
    let allreduce = Cmd::Allreduce as u8;
    let bcast = Cmd::Bcast as u8;
    assert_eq!(
        got,
        [
            ("new".to_string(), bcast, Cmd::Bcast, 4),
            ("old".to_string(), bcast, Cmd::Bcast, 4),
            // Class 1: 8 + 1 in the high nibble, for the node that agreed.
            ("new".to_string(), 0x90 | allreduce, Cmd::Allreduce, 1),
            ("old".to_string(), allreduce, Cmd::Allreduce, 4),
        ]
    );
}

/// A member that joins and never answers a command.
async fn silent_member(server: SocketAddr, name: &str) {
    let (rd, mut w) = TcpStream::connect(server).await.unwrap().into_split();
    let mut hello = Hello::new("node");
    hello.name = Some(name.into());
    hello.features = vec![features::ERROR.into(), features::PEER.into()];
    hello.peer = Some("127.0.0.1:9".into());
    write_frame(&mut w, hello.to_frame()).await.unwrap();
    tokio::spawn(async move {
        let mut r = FrameReader::new(rd, 1 << 20);
        while let Ok(Some(f)) = r.read_frame().await {
            if let (MsgType::GroupCtl, Ok(GroupCtl::Join { group, .. })) =
                (f.ty, GroupCtl::decode(&f.payload))
            {
                let joined = GroupCtl::Joined { group, error: None };
                write_frame(&mut w, joined.to_frame()).await.unwrap();
            }
        }
    });
}

#[tokio::test]
async fn a_close_behind_a_full_window_of_commands_still_ends_the_group() {
    let s = start(opts()).await;
    silent_member(s.nodes, "mute").await;
    s.wait_status("a free node with a hello", |st| {
        st.nodes
            .iter()
            .any(|n| n.name.is_some() && n.user.is_none())
    })
    .await;
    let (rd, mut w) = TcpStream::connect(s.users).await.unwrap().into_split();
    let mut r = FrameReader::new(rd, 1 << 20);
    let mut next = async move || {
        tokio::time::timeout(LIMIT, r.read_frame())
            .await
            .expect("an answer in time")
            .unwrap()
            .expect("open")
    };
    let mut h = Hello::new("user");
    h.features = vec![features::ERROR.into(), features::GROUP.into()];
    write_frame(&mut w, h.to_frame()).await.unwrap();
    assert_eq!(next().await.ty, MsgType::Hello);
    let open = GroupCtl::Open {
        nodes: 1,
        topology: None,
    };
    write_frame(&mut w, open.to_frame()).await.unwrap();
    let f = next().await;
    assert!(matches!(
        GroupCtl::decode(&f.payload),
        Ok(GroupCtl::Opened { .. })
    ));
    // 64 commands the member never answers (the server's window), then
    // `close`.
    for seq in 1..=64 {
        let mut c = GroupCmd::new(seq, 0, Cmd::Barrier);
        c.timeout_ms = 600_000;
        write_frame(&mut w, c.to_frame().unwrap()).await.unwrap();
    }
    write_frame(&mut w, GroupCtl::Close.to_frame())
        .await
        .unwrap();
    loop {
        let f = next().await;
        if f.ty == MsgType::GroupCtl {
            let c = GroupCtl::decode(&f.payload).unwrap();
            assert!(matches!(c, GroupCtl::Closed { .. }), "{c:?}");
            break;
        }
    }
}
