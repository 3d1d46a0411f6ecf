// vadd (AMD/Vitis style) - the vadd reference core with an ap_ctrl_hs
// AXI4-Lite control slave and an AXI4 master, as Vitis HLS builds
// vadd_vitis.cpp: c[i] = a[i] + b[i] (int8, wrapping) for i < n.
//
// Arguments (cores/rtl/cf_axil_ctrl.v): a at 0x10, b at 0x1C, c at 0x28
// (64-bit pointers into host memory), n at 0x34 (elements, a multiple of 8,
// at most 1024). A job reads a and b into local memory in bursts, adds one
// 64-bit word (8 lanes) per cycle, writes c back and raises ap_done.
// Port list: cores/rtl/cf_axi_ports.vh.
module vadd (
`include "cf_axi_ports.vh"
);
    localparam NWORDS = 11;
    localparam WORDS = 128;  // 64-bit words of a full vector
    localparam IDLE = 3'd0, LOAD_A = 3'd1, LOAD_B = 3'd2, ADD = 3'd3, STORE = 3'd4, FIN = 3'd5;

    reg [63:0] mem_a[0:WORDS-1];
    reg [63:0] mem_b[0:WORDS-1];
    reg [63:0] mem_o[0:WORDS-1];

    reg  [2:0] state;
    reg        issued;  // this state's DMA command was taken
    reg  [7:0] idx, words;
    reg        dma_valid, dma_write;
    reg [63:0] dma_addr;
    reg [31:0] dma_words;
    wire [63:0] lm_rdata = mem_o[lm_raddr[6:0]];
    wire ap_idle = state == IDLE;
    wire ap_ready = ap_idle && ap_start;
    wire ap_done = state == FIN;
`include "cf_axi_instances.vh"

    wire [63:0] ptr_a = args[63:0];
    wire [63:0] ptr_b = args[32*3+:64];
    wire [63:0] ptr_c = args[32*6+:64];
    wire [31:0] n = args[32*9+:32];

    function [63:0] add_lanes(input [63:0] x, input [63:0] y);
        integer l;
        for (l = 0; l < 8; l = l + 1) add_lanes[8*l+:8] = x[8*l+:8] + y[8*l+:8];
    endfunction

    always @(posedge ap_clk) begin
        dma_valid <= 1'b0;
        if (!ap_rst_n) begin
            state <= IDLE;
            issued <= 1'b0;
            idx <= 8'd0;
            words <= 8'd0;
        end else case (state)
            IDLE:
                if (ap_start) begin
                    words <= n > 32'd1024 ? 8'd128 : n[10:3];
                    issued <= 1'b0;
                    state <= LOAD_A;
                end
            LOAD_A, LOAD_B, STORE:
                if (!issued) begin
                    if (dma_ready && !dma_valid) begin
                        dma_valid <= 1'b1;
                        dma_write <= state == STORE;
                        dma_addr <= state == LOAD_A ? ptr_a : state == LOAD_B ? ptr_b : ptr_c;
                        dma_words <= {24'd0, words};
                        issued <= 1'b1;
                    end
                end else if (dma_done) begin
                    issued <= 1'b0;
                    idx <= 8'd0;
                    state <= state == LOAD_A ? LOAD_B : state == LOAD_B ? ADD : FIN;
                end
            ADD:
                if (idx == words) state <= STORE;
                else begin
                    mem_o[idx[6:0]] <= add_lanes(mem_a[idx[6:0]], mem_b[idx[6:0]]);
                    idx <= idx + 8'd1;
                end
            default: state <= IDLE;  // FIN: ap_done for one cycle
        endcase
    end

    always @(posedge ap_clk)
        if (lm_we) begin
            if (state == LOAD_A) mem_a[lm_waddr[6:0]] <= lm_wdata;
            else mem_b[lm_waddr[6:0]] <= lm_wdata;
        end
endmodule
