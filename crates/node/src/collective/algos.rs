//! The phases collectives are made of, over any tree: chunks are forwarded
//! as soon as they arrive, so the linear chain pipelines (seed 003 §4.2.2.4)
//! and every tree overlaps its stages.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};

use super::reduce::{check, combine};
use super::{chunks, Chunk, CollError, Ctx, Group};

/// A block being received chunk by chunk.
struct Incoming {
    total: u64,
    buf: BytesMut,
    got: u64,
}

impl Group {
    /// Checks a chunk against the block it continues (or starts) and
    /// returns whether the block is now complete.
    fn accept_chunk(
        &self,
        ctx: &Ctx,
        c: &Chunk,
        blk: &mut Option<Incoming>,
        keep: bool,
    ) -> Result<bool, CollError> {
        let (h, len) = (&c.coll, c.data.len() as u64);
        let b = match blk {
            Some(b) => b,
            None => {
                if h.total > self.opts.max_block {
                    let m = self.opts.max_block;
                    return Err(self.peer_err(
                        ctx,
                        c.src,
                        format!(
                            "announced a block of {} bytes, over the limit of {m}",
                            h.total
                        ),
                    ));
                }
                let cap = if keep { h.total as usize } else { 0 };
                blk.insert(Incoming {
                    total: h.total,
                    buf: BytesMut::with_capacity(cap),
                    got: 0,
                })
            }
        };
        if h.total != b.total || h.offset != b.got || (len == 0 && b.total != 0) {
            return Err(self.peer_err(
                ctx,
                c.src,
                format!(
                    "sent {len} bytes at offset {} of a {}-byte block of rank {}; expected offset {} of {} bytes",
                    h.offset, h.total, h.block, b.got, b.total
                ),
            ));
        }
        b.got += len;
        if keep {
            b.buf.extend_from_slice(&c.data);
        }
        Ok(b.got == b.total)
    }

    pub(super) async fn bcast_phase(
        &mut self,
        ctx: &Ctx,
        phase: u8,
        data: Bytes,
    ) -> Result<Bytes, CollError> {
        let me = self.rank();
        let children = ctx.tree.children(me);
        let Some(parent) = ctx.tree.parent(me) else {
            for (off, len) in chunks(data.len(), self.opts.chunk) {
                let h = ctx.header(phase, me, off as u64, data.len() as u64);
                for &c in &children {
                    self.send(ctx, c, h, data.slice(off..off + len)).await?;
                }
            }
            return Ok(data);
        };
        let mut blk = None;
        loop {
            let c = self.recv(ctx, phase, &[parent], parent).await?;
            // A block that fits one chunk is passed on and returned without a copy.
            let whole = blk.is_none() && c.coll.offset == 0 && c.coll.total == c.data.len() as u64;
            let done = self.accept_chunk(ctx, &c, &mut blk, !whole)?;
            for &child in &children {
                self.send(ctx, child, c.coll, c.data.clone()).await?;
            }
            if whole {
                return Ok(c.data);
            }
            if done {
                return Ok(blk.expect("started").buf.freeze());
            }
        }
    }

    pub(super) async fn reduce_phase(
        &mut self,
        ctx: &Ctx,
        phase: u8,
        data: Bytes,
    ) -> Result<Option<Bytes>, CollError> {
        check(data.len(), ctx.dtype, ctx.reduce).map_err(|e| self.local_err(ctx, e.to_string()))?;
        let me = self.rank();
        let children = ctx.tree.children(me);
        let parent = ctx.tree.parent(me);
        let esize = ctx.dtype.size();
        let step = (self.opts.chunk / esize).max(1) * esize;
        let mut out = BytesMut::with_capacity(if parent.is_none() { data.len() } else { 0 });
        for (off, len) in chunks(data.len(), step) {
            let mut acc = BytesMut::from(&data[off..off + len]);
            for &child in &children {
                let c = self.recv(ctx, phase, &[child], child).await?;
                let h = c.coll;
                if h.total != data.len() as u64 || h.offset != off as u64 || c.data.len() != len {
                    return Err(self.peer_err(
                        ctx,
                        child,
                        format!(
                            "contributes {} bytes (chunk of {} at offset {}) where this rank has {} (chunk of {len} at {off})",
                            h.total,
                            c.data.len(),
                            h.offset,
                            data.len()
                        ),
                    ));
                }
                combine(ctx.dtype, ctx.reduce, &mut acc, &c.data)
                    .map_err(|e| self.peer_err(ctx, child, e.to_string()))?;
            }
            match parent {
                Some(p) => {
                    let h = ctx.header(phase, me, off as u64, data.len() as u64);
                    self.send(ctx, p, h, acc.freeze()).await?;
                }
                None => out.extend_from_slice(&acc),
            }
        }
        Ok(parent.is_none().then(|| out.freeze()))
    }

    pub(super) async fn gather_phase(
        &mut self,
        ctx: &Ctx,
        phase: u8,
        data: Bytes,
    ) -> Result<Option<Vec<Bytes>>, CollError> {
        let me = self.rank();
        let tree = ctx.tree;
        let children = tree.children(me);
        let parent = tree.parent(me);
        if let Some(p) = parent {
            self.send_block(ctx, phase, p, me, &data).await?;
        }
        let mut blocks: HashMap<u32, Option<Incoming>> =
            tree.subtree(me).skip(1).map(|r| (r, None)).collect();
        let mut left = blocks.len();
        while left > 0 {
            // Blame the first child whose subtree still owes a block.
            let blame = children
                .iter()
                .copied()
                .find(|&c| {
                    tree.subtree(c)
                        .any(|r| blocks[&r].as_ref().is_none_or(|b| b.got != b.total))
                })
                .unwrap_or(children[0]);
            let c = self.recv(ctx, phase, &children, blame).await?;
            let block = c.coll.block;
            if !tree.in_subtree(c.src, block) {
                return Err(self.peer_err(
                    ctx,
                    c.src,
                    format!("sent the block of rank {block}, which is not in its subtree"),
                ));
            }
            let slot = blocks.get_mut(&block).expect("subtree ranks have slots");
            if slot.as_ref().is_some_and(|b| b.got == b.total) {
                return Err(self.peer_err(
                    ctx,
                    c.src,
                    format!("sent more of the complete block of rank {block}"),
                ));
            }
            let mut blk = slot.take();
            let done = self.accept_chunk(ctx, &c, &mut blk, parent.is_none())?;
            *blocks.get_mut(&block).expect("slot") = blk;
            if let Some(p) = parent {
                self.send(ctx, p, c.coll, c.data).await?;
            }
            if done {
                left -= 1;
            }
        }
        if parent.is_some() {
            return Ok(None);
        }
        let mut all: Vec<Bytes> = (0..self.size())
            .map(|r| match blocks.remove(&r) {
                Some(Some(b)) => b.buf.freeze(),
                _ => Bytes::new(),
            })
            .collect();
        all[me as usize] = data;
        Ok(Some(all))
    }

    pub(super) async fn scatter_phase(
        &mut self,
        ctx: &Ctx,
        phase: u8,
        parts: Vec<Bytes>,
    ) -> Result<Bytes, CollError> {
        let me = self.rank();
        let tree = ctx.tree;
        let children = tree.children(me);
        let Some(parent) = tree.parent(me) else {
            if parts.len() != self.size() as usize {
                return Err(self.local_err(
                    ctx,
                    format!("{} parts for {} members", parts.len(), self.size()),
                ));
            }
            for &c in &children {
                for r in tree.subtree(c) {
                    self.send_block(ctx, phase, c, r, &parts[r as usize])
                        .await?;
                }
            }
            return Ok(parts[me as usize].clone());
        };
        let mut blocks: HashMap<u32, Option<Incoming>> =
            tree.subtree(me).map(|r| (r, None)).collect();
        let mut left = blocks.len();
        while left > 0 {
            let c = self.recv(ctx, phase, &[parent], parent).await?;
            let block = c.coll.block;
            let Some(slot) = blocks.get_mut(&block) else {
                return Err(self.peer_err(
                    ctx,
                    parent,
                    format!("sent the block of rank {block}, not in this rank's subtree"),
                ));
            };
            if slot.as_ref().is_some_and(|b| b.got == b.total) {
                return Err(self.peer_err(
                    ctx,
                    parent,
                    format!("sent more of the complete block of rank {block}"),
                ));
            }
            let mut blk = slot.take();
            let done = self.accept_chunk(ctx, &c, &mut blk, block == me)?;
            *blocks.get_mut(&block).expect("slot") = blk;
            if block != me {
                let child = *children
                    .iter()
                    .find(|&&ch| tree.in_subtree(ch, block))
                    .expect("a subtree rank below me is under a child");
                self.send(ctx, child, c.coll, c.data).await?;
            }
            if done {
                left -= 1;
            }
        }
        Ok(blocks
            .remove(&me)
            .flatten()
            .map(|b| b.buf.freeze())
            .unwrap_or_default())
    }

    /// Gather to rank 0, then broadcast the blocks as `n` u64 lengths followed by the data.
    pub(super) async fn allgather_phases(
        &mut self,
        ctx: &Ctx,
        data: Bytes,
    ) -> Result<Vec<Bytes>, CollError> {
        let n = self.size() as usize;
        let packed = match self.gather_phase(ctx, 0, data).await? {
            Some(blocks) => {
                let mut v =
                    BytesMut::with_capacity(8 * n + blocks.iter().map(Bytes::len).sum::<usize>());
                for b in &blocks {
                    v.extend_from_slice(&(b.len() as u64).to_le_bytes());
                }
                for b in &blocks {
                    v.extend_from_slice(b);
                }
                v.freeze()
            }
            None => Bytes::new(),
        };
        let all = self.bcast_phase(ctx, 1, packed).await?;
        let bad = |why: &str| {
            self.peer_err(
                ctx,
                0,
                format!("broadcast a malformed allgather result: {why}"),
            )
        };
        if all.len() < 8 * n {
            return Err(bad("shorter than its length table"));
        }
        let mut at = 8 * n;
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let len = u64::from_le_bytes(all[8 * i..8 * i + 8].try_into().expect("8 bytes"));
            let end = (at as u64)
                .checked_add(len)
                .filter(|&e| e <= all.len() as u64)
                .ok_or_else(|| bad("a block overruns it"))? as usize;
            out.push(all.slice(at..end));
            at = end;
        }
        if at != all.len() {
            return Err(bad("bytes after the last block"));
        }
        Ok(out)
    }
}
