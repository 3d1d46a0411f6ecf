// saxpy - Verilog form of saxpy.cpp: out[i] = a * x[i] + y[i] over
// N = 256 int32, wrapping. One 64-bit output word (2 lanes) per cycle:
// 128 busy cycles per job.
//
// Input memory, 257 words: word 0 = {pad, a}, words 1..128 = x, 129..256 = y.
// Output memory, 128 words. Port list and CSR rules: docs/writing-a-core.md.
module saxpy (
    input             clock,
    input             resetn,
    input      [31:0] avs_cra_address,
    input             avs_cra_read,
    input             avs_cra_write,
    input      [63:0] avs_cra_writedata,
    input       [7:0] avs_cra_byteenable,
    output     [63:0] avs_cra_readdata,
    input      [31:0] avs_in_address,
    input             avs_in_read,
    input             avs_in_write,
    input      [63:0] avs_in_writedata,
    input       [7:0] avs_in_byteenable,
    output reg [63:0] avs_in_readdata,
    input      [31:0] avs_out_address,
    input             avs_out_read,
    input             avs_out_write,
    input      [63:0] avs_out_writedata,
    input       [7:0] avs_out_byteenable,
    output reg [63:0] avs_out_readdata,
    output            irq
);
    localparam IN_WORDS = 257, OUT_WORDS = 128;
    // Bytes of one input and one output: `corefarm image build` reads these.
    localparam INPUT_SIZE = 2056, OUTPUT_SIZE = 1024;
    reg [63:0] mem_in[0:IN_WORDS-1];
    reg [63:0] mem_out[0:OUT_WORDS-1];

    // ------------------------------------------- CSR (seed 000 table 3.1)
    wire busy;                                       // cf_csr: table 3.1 registers
    reg [7:0] idx;                                   // output word being computed
    wire finish = busy && idx == OUT_WORDS - 1;      // last word this cycle
    cf_csr csr (
        .clock(clock), .resetn(resetn),
        .address(avs_cra_address), .read(avs_cra_read), .write(avs_cra_write),
        .writedata(avs_cra_writedata), .byteenable(avs_cra_byteenable),
        .readdata(avs_cra_readdata), .finish(finish), .busy(busy), .irq(irq)
    );

    // -------------------------------------------------------- datapath
    wire [31:0] a = mem_in[0][31:0];
    wire [63:0] x = mem_in[9'd1 + {1'b0, idx}];
    wire [63:0] y = mem_in[9'd129 + {1'b0, idx}];

    always @(posedge clock) begin
        if (!resetn || !busy) idx <= 8'd0;
        else begin
            // The low 32 bits of a product do not depend on signedness.
            mem_out[idx[6:0]] <= {a * x[63:32] + y[63:32], a * x[31:0] + y[31:0]};
            idx <= idx + 8'd1;
        end
    end

    // ------------------------------- bus memories (not cleared by reset)
    integer b;
    always @(posedge clock) begin
        if (avs_in_write && avs_in_address < IN_WORDS)
            for (b = 0; b < 8; b = b + 1)
                if (avs_in_byteenable[b])
                    mem_in[avs_in_address[8:0]][8*b+:8] <= avs_in_writedata[8*b+:8];
        if (avs_in_read)
            avs_in_readdata <= avs_in_address < IN_WORDS ? mem_in[avs_in_address[8:0]] : 64'd0;
        if (avs_out_write && avs_out_address < OUT_WORDS)
            for (b = 0; b < 8; b = b + 1)
                if (avs_out_byteenable[b])
                    mem_out[avs_out_address[6:0]][8*b+:8] <= avs_out_writedata[8*b+:8];
        if (avs_out_read)
            avs_out_readdata <= avs_out_address < OUT_WORDS ? mem_out[avs_out_address[6:0]] : 64'd0;
    end
endmodule
