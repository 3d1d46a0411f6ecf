// cf_axil_ctrl - the `s_axi_control` AXI4-Lite slave of a Vitis HLS core
// with the ap_ctrl_hs protocol, as Vitis generates it (32-bit registers):
//
//   0x00 control: bit 0 ap_start (R/W, cleared when the core takes the job
//        unless auto_restart), 1 ap_done (R, clear on read), 2 ap_idle (R),
//        3 ap_ready (R), 7 auto_restart (R/W)
//   0x04 global interrupt enable (bit 0)
//   0x08 IP interrupt enable: bit 0 ap_done, bit 1 ap_ready
//   0x0C IP interrupt status: same bits, toggled by writing 1
//   0x10 + 4*i  argument word i (NWORDS of them): a 64-bit pointer takes two
//        words and a reserved one, a 32-bit scalar one word and a reserved one
//
// The core sees `ap_start` and answers with `ap_ready` (one cycle, when it
// takes the job), `ap_done` (one cycle, when it ends) and `ap_idle`.
// corefarm's RTL toolchain links this file into every AXI build.
module cf_axil_ctrl #(
    parameter NWORDS = 12
) (
    input                      clock,
    input                      resetn,
    input                      AWVALID,
    output                     AWREADY,
    input               [7:0]  AWADDR,
    input                      WVALID,
    output                     WREADY,
    input              [31:0]  WDATA,
    input               [3:0]  WSTRB,
    output reg                 BVALID,
    input                      BREADY,
    output              [1:0]  BRESP,
    input                      ARVALID,
    output                     ARREADY,
    input               [7:0]  ARADDR,
    output reg                 RVALID,
    input                      RREADY,
    output reg         [31:0]  RDATA,
    output              [1:0]  RRESP,
    output                     interrupt,
    output reg                 ap_start,
    input                      ap_ready,
    input                      ap_done,
    input                      ap_idle,
    output [32*NWORDS-1:0]     args
);
    reg        int_done, auto_restart, gie;
    reg  [1:0] ier, isr;
    // 64 words (the whole 8-bit address space) so a word offset indexes it
    // as is; those past NWORDS are neither written nor read.
    reg [31:0] arg [0:63];

    genvar g;
    generate
        for (g = 0; g < NWORDS; g = g + 1) begin : flat
            assign args[32*g+:32] = arg[g];
        end
    endgenerate

    assign BRESP = 2'b00;
    assign RRESP = 2'b00;
    // A write takes address and data together, one at a time.
    wire wr = AWVALID && WVALID && !BVALID;
    assign AWREADY = wr;
    assign WREADY = wr;
    assign ARREADY = !RVALID;
    wire rd = ARVALID && ARREADY;
    assign interrupt = gie && (isr != 2'b00);

    wire [7:0] woff = AWADDR - 8'h10;
    wire [7:0] roff = ARADDR - 8'h10;
    wire [31:0] wmask = {{8{WSTRB[3]}}, {8{WSTRB[2]}}, {8{WSTRB[1]}}, {8{WSTRB[0]}}};

    integer n;
    always @(posedge clock) begin
        if (!resetn) begin
            BVALID <= 1'b0;
            RVALID <= 1'b0;
            RDATA <= 32'd0;
            ap_start <= 1'b0;
            int_done <= 1'b0;
            auto_restart <= 1'b0;
            gie <= 1'b0;
            ier <= 2'b00;
            isr <= 2'b00;
            for (n = 0; n < NWORDS; n = n + 1) arg[n] <= 32'd0;
        end else begin
            if (BVALID && BREADY) BVALID <= 1'b0;
            if (RVALID && RREADY) RVALID <= 1'b0;
            if (wr) begin
                BVALID <= 1'b1;
                case (AWADDR)
                    8'h04: if (WSTRB[0]) gie <= WDATA[0];
                    8'h08: if (WSTRB[0]) ier <= WDATA[1:0];
                    default: ;
                endcase
                if (AWADDR >= 8'h10 && AWADDR[1:0] == 2'b00 && woff[7:2] < NWORDS)
                    arg[woff[7:2]] <= (arg[woff[7:2]] & ~wmask) | (WDATA & wmask);
            end
            if (rd) begin
                RVALID <= 1'b1;
                case (ARADDR)
                    8'h00: RDATA <= {24'd0, auto_restart, 3'd0, ap_ready, ap_idle, int_done, ap_start};
                    8'h04: RDATA <= {31'd0, gie};
                    8'h08: RDATA <= {30'd0, ier};
                    8'h0C: RDATA <= {30'd0, isr};
                    default: RDATA <= (ARADDR >= 8'h10 && ARADDR[1:0] == 2'b00 && roff[7:2] < NWORDS)
                                      ? arg[roff[7:2]] : 32'd0;
                endcase
            end
            // ap_start: set by the host, taken by the core.
            if (wr && AWADDR == 8'h00 && WSTRB[0] && WDATA[0]) ap_start <= 1'b1;
            else if (ap_ready && !auto_restart) ap_start <= 1'b0;
            if (wr && AWADDR == 8'h00 && WSTRB[0]) auto_restart <= WDATA[7];
            // ap_done: a completion wins over a same-cycle read.
            if (ap_done) int_done <= 1'b1;
            else if (rd && ARADDR == 8'h00) int_done <= 1'b0;
            // Status bits: set by their event when enabled, toggled by a write.
            if (wr && AWADDR == 8'h0C && WSTRB[0])
                isr <= (isr ^ WDATA[1:0]) | ({ap_ready, ap_done} & ier);
            else
                isr <= isr | ({ap_ready, ap_done} & ier);
        end
    end
endmodule
