// cf_axi_dma - the AXI4 master (`m_axi_gmem`, 64-bit data) of a Vitis-style
// core: moves `cmd_words` 64-bit words between host memory at `cmd_addr`
// (8-byte aligned) and the core's local memory, in INCR bursts of at most
// 256 beats that never cross a 4 KiB boundary, one burst at a time.
//
//   cmd_write = 0: host -> local (AR/R), local word i <= host word i
//   cmd_write = 1: local -> host (AW/W/B), host word i <= local word i
//
// The local memory is read combinationally (`lm_rdata = mem[lm_raddr]`) so
// a write burst moves one beat per cycle the slave accepts. Every valid
// is a function of the state, which changes only on its handshake, so
// valids and their payloads hold until ready. corefarm's RTL toolchain
// links this file into every AXI build.
module cf_axi_dma (
    input             clock,
    input             resetn,
    input             cmd_valid,
    input             cmd_write,
    input      [63:0] cmd_addr,
    input      [31:0] cmd_words,
    output            cmd_ready,
    output reg        cmd_done,
    output reg        lm_we,
    output reg [31:0] lm_waddr,
    output reg [63:0] lm_wdata,
    output     [31:0] lm_raddr,
    input      [63:0] lm_rdata,
    output            AWVALID,
    input             AWREADY,
    output     [63:0] AWADDR,
    output      [7:0] AWLEN,
    output      [2:0] AWSIZE,
    output      [1:0] AWBURST,
    output            WVALID,
    input             WREADY,
    output     [63:0] WDATA,
    output      [7:0] WSTRB,
    output            WLAST,
    input             BVALID,
    output            BREADY,
    input       [1:0] BRESP,
    output            ARVALID,
    input             ARREADY,
    output     [63:0] ARADDR,
    output      [7:0] ARLEN,
    output      [2:0] ARSIZE,
    output      [1:0] ARBURST,
    input             RVALID,
    output            RREADY,
    input      [63:0] RDATA,
    input             RLAST,
    input       [1:0] RRESP
);
    localparam IDLE = 3'd0, RADDR = 3'd1, RDAT = 3'd2, WADDR = 3'd3, WDAT = 3'd4, WRESP = 3'd5;
    reg  [2:0] state;
    reg [63:0] addr;
    reg [31:0] remaining, index;
    reg  [8:0] blen, beats;

    // Beats of the next burst: what is left, at most 256, up to the next
    // 4 KiB boundary.
    wire [12:0] to_boundary = (13'd4096 - {1'b0, addr[11:0]}) >> 3;
    wire [31:0] cap = to_boundary > 13'd256 ? 32'd256 : {19'd0, to_boundary};
    wire  [8:0] next_len = remaining < cap ? remaining[8:0] : cap[8:0];

    assign cmd_ready = state == IDLE;
    assign ARVALID = state == RADDR;
    assign ARADDR = addr;
    assign ARLEN = next_len[7:0] - 8'd1;
    assign ARSIZE = 3'd3;
    assign ARBURST = 2'b01;
    assign RREADY = state == RDAT;
    assign AWVALID = state == WADDR;
    assign AWADDR = addr;
    assign AWLEN = next_len[7:0] - 8'd1;
    assign AWSIZE = 3'd3;
    assign AWBURST = 2'b01;
    assign WVALID = state == WDAT;
    assign WDATA = lm_rdata;
    assign WSTRB = 8'hFF;
    assign WLAST = beats == 9'd1;
    assign BREADY = state == WRESP;
    assign lm_raddr = index;

    always @(posedge clock) begin
        lm_we <= 1'b0;
        cmd_done <= 1'b0;
        if (!resetn) begin
            state <= IDLE;
            addr <= 64'd0;
            remaining <= 32'd0;
            index <= 32'd0;
            blen <= 9'd0;
            beats <= 9'd0;
        end else case (state)
            IDLE:
                if (cmd_valid) begin
                    addr <= cmd_addr;
                    remaining <= cmd_words;
                    index <= 32'd0;
                    if (cmd_words == 32'd0) cmd_done <= 1'b1;
                    else state <= cmd_write ? WADDR : RADDR;
                end
            RADDR:
                if (ARREADY) begin
                    blen <= next_len;
                    state <= RDAT;
                end
            RDAT:
                if (RVALID) begin
                    lm_we <= 1'b1;
                    lm_waddr <= index;
                    lm_wdata <= RDATA;
                    index <= index + 32'd1;
                    if (RLAST) begin
                        addr <= addr + {52'd0, blen, 3'd0};
                        remaining <= remaining - {23'd0, blen};
                        if (remaining == {23'd0, blen}) begin
                            state <= IDLE;
                            cmd_done <= 1'b1;
                        end else state <= RADDR;
                    end
                end
            WADDR:
                if (AWREADY) begin
                    blen <= next_len;
                    beats <= next_len;
                    state <= WDAT;
                end
            WDAT:
                if (WREADY) begin
                    index <= index + 32'd1;
                    beats <= beats - 9'd1;
                    if (beats == 9'd1) state <= WRESP;
                end
            WRESP:
                if (BVALID) begin
                    addr <= addr + {52'd0, blen, 3'd0};
                    remaining <= remaining - {23'd0, blen};
                    if (remaining == {23'd0, blen}) begin
                        state <= IDLE;
                        cmd_done <= 1'b1;
                    end else state <= WADDR;
                end
            default: state <= IDLE;
        endcase
    end
endmodule
