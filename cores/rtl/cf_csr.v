// cf_csr - the control/status register block every corefarm RTL core shares
// (seed 000 table 3.1), on the core's `avs_cra_*` Avalon-MM agent.
//
//   word 0 (0x00) R   busy: 1 from an accepted start until the job finishes
//   word 1 (0x08) W   start: write 1; ignored while busy
//   word 2 (0x10) R/W interrupt enable
//   word 3 (0x18) R/W done / interrupt status: set when the job finishes,
//                     stays set until written 1 (a finish in the same cycle wins)
//
// The datapath sees `busy` and raises `finish` for one cycle on its last
// cycle of work. corefarm's RTL toolchain links this file into every RTL
// build, so a core instantiates `cf_csr` without listing it as a source.
module cf_csr (
    input             clock,
    input             resetn,
    input      [31:0] address,
    input             read,
    input             write,
    input      [63:0] writedata,
    input       [7:0] byteenable,
    output reg [63:0] readdata,
    input             finish,
    output reg        busy,
    output            irq
);
    reg done, int_enable;
    wire wr0 = write && byteenable[0];
    assign irq = done & int_enable;

    always @(posedge clock) begin
        if (!resetn) begin
            busy <= 1'b0;
            done <= 1'b0;
            int_enable <= 1'b0;
            readdata <= 64'd0;
        end else begin
            if (read)
                case (address)
                    32'd0: readdata <= {63'd0, busy};
                    32'd2: readdata <= {63'd0, int_enable};
                    32'd3: readdata <= {63'd0, done};
                    default: readdata <= 64'd0;
                endcase
            if (wr0 && address == 32'd2) int_enable <= writedata[0];
            // Completion wins over a same-cycle clear so no job end is lost.
            if (finish) done <= 1'b1;
            else if (wr0 && address == 32'd3 && writedata[0]) done <= 1'b0;
            // A start while busy is ignored (table 3.1: busy = cannot accept).
            if (finish) busy <= 1'b0;
            else if (wr0 && address == 32'd1 && writedata[0]) busy <= 1'b1;
        end
    end
endmodule
