// mat_mul_64x64 (AMD/Vitis style) - the 64x64 int32 matrix multiplier with
// an ap_ctrl_hs AXI4-Lite control slave and an AXI4 master, as Vitis HLS
// builds matmul_vitis.cpp: C = A * B (wrapping), row-major, little-endian.
//
// Arguments (cores/rtl/cf_axil_ctrl.v): A at 0x10, B at 0x1C, C at 0x28
// (64-bit pointers into host memory, 16384 bytes each). A job reads A and
// B into local memory in bursts, does one multiply-accumulate per cycle
// (262144 cycles, as the Avalon version), writes C back and raises ap_done.
// Port list: cores/rtl/cf_axi_ports.vh.
module mat_mul_64x64 (
`include "cf_axi_ports.vh"
);
    localparam NWORDS = 9;
    localparam WORDS = 2048;  // 64-bit words of one matrix
    localparam IDLE = 3'd0, LOAD_A = 3'd1, LOAD_B = 3'd2, MAC = 3'd3, STORE = 3'd4, FIN = 3'd5;

    reg [31:0] mem_a[0:4095];
    reg [31:0] mem_b[0:4095];
    reg [31:0] mem_o[0:4095];

    reg  [2:0] state;
    reg        issued;
    reg [17:0] step;  // {i, j, k} of the multiply-accumulate in progress
    reg        dma_valid, dma_write;
    reg [63:0] dma_addr;
    reg [31:0] dma_words;
    wire [63:0] lm_rdata = {mem_o[{lm_raddr[10:0], 1'b1}], mem_o[{lm_raddr[10:0], 1'b0}]};
    wire ap_idle = state == IDLE;
    wire ap_ready = ap_idle && ap_start;
    wire ap_done = state == FIN;
`include "cf_axi_instances.vh"

    wire [63:0] ptr_a = args[63:0];
    wire [63:0] ptr_b = args[32*3+:64];
    wire [63:0] ptr_c = args[32*6+:64];

    wire [5:0] i = step[17:12];
    wire [5:0] j = step[11:6];
    wire [5:0] k = step[5:0];
    reg  [31:0] acc;
    wire [31:0] sum = (k == 6'd0 ? 32'd0 : acc) + mem_a[{i, k}] * mem_b[{k, j}];

    always @(posedge ap_clk) begin
        dma_valid <= 1'b0;
        if (!ap_rst_n) begin
            state <= IDLE;
            issued <= 1'b0;
            step <= 18'd0;
        end else case (state)
            IDLE:
                if (ap_start) begin
                    issued <= 1'b0;
                    state <= LOAD_A;
                end
            LOAD_A, LOAD_B, STORE:
                if (!issued) begin
                    if (dma_ready && !dma_valid) begin
                        dma_valid <= 1'b1;
                        dma_write <= state == STORE;
                        dma_addr <= state == LOAD_A ? ptr_a : state == LOAD_B ? ptr_b : ptr_c;
                        dma_words <= WORDS;
                        issued <= 1'b1;
                    end
                end else if (dma_done) begin
                    issued <= 1'b0;
                    step <= 18'd0;
                    state <= state == LOAD_A ? LOAD_B : state == LOAD_B ? MAC : FIN;
                end
            MAC: begin
                acc <= sum;
                if (k == 6'd63) mem_o[{i, j}] <= sum;
                step <= step + 18'd1;
                if (step == 18'h3FFFF) state <= STORE;
            end
            default: state <= IDLE;  // FIN: ap_done for one cycle
        endcase
    end

    always @(posedge ap_clk)
        if (lm_we) begin
            if (state == LOAD_A) begin
                mem_a[{lm_waddr[10:0], 1'b0}] <= lm_wdata[31:0];
                mem_a[{lm_waddr[10:0], 1'b1}] <= lm_wdata[63:32];
            end else begin
                mem_b[{lm_waddr[10:0], 1'b0}] <= lm_wdata[31:0];
                mem_b[{lm_waddr[10:0], 1'b1}] <= lm_wdata[63:32];
            end
        end
endmodule
