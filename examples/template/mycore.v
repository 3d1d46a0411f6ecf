// mycore - corefarm Verilog core template (docs/writing-a-core.md).
// Computes out[w] = ~in[w] for WORDS 64-bit words, one word per cycle.
// Keep the port list, the cf_csr instance and the bus memories; replace
// the datapath and pulse `finish` for one cycle when a job ends.
module mycore #(parameter WORDS = 128) (          // 1024-byte input and output
    input             clock,
    input             resetn,                     // active low, synchronous
    input      [31:0] avs_cra_address,            // CSR: word address 0..3
    input             avs_cra_read,
    input             avs_cra_write,
    input      [63:0] avs_cra_writedata,
    input       [7:0] avs_cra_byteenable,
    output     [63:0] avs_cra_readdata,
    input      [31:0] avs_in_address,             // input memory
    input             avs_in_read,
    input             avs_in_write,
    input      [63:0] avs_in_writedata,
    input       [7:0] avs_in_byteenable,
    output reg [63:0] avs_in_readdata,
    input      [31:0] avs_out_address,            // output memory
    input             avs_out_read,
    input             avs_out_write,
    input      [63:0] avs_out_writedata,
    input       [7:0] avs_out_byteenable,
    output reg [63:0] avs_out_readdata,
    output            irq
);
    // Bytes of one input and one output: `corefarm image build` reads these.
    localparam INPUT_SIZE = 8 * WORDS, OUTPUT_SIZE = 8 * WORDS;
    reg [63:0] mem_in[0:WORDS-1];
    reg [63:0] mem_out[0:WORDS-1];

    // ---- CSR block (seed 000 table 3.1): corefarm's cf_csr, keep as is ------
    wire busy, finish;
    cf_csr csr (
        .clock(clock), .resetn(resetn),
        .address(avs_cra_address), .read(avs_cra_read), .write(avs_cra_write),
        .writedata(avs_cra_writedata), .byteenable(avs_cra_byteenable),
        .readdata(avs_cra_readdata), .finish(finish), .busy(busy), .irq(irq)
    );

    // ---- datapath: replace ------------------------------------------------
    reg [31:0] idx;
    assign finish = busy && idx == WORDS - 1;
    always @(posedge clock)
        if (!resetn || !busy) idx <= 32'd0;
        else begin
            mem_out[idx] <= ~mem_in[idx];
            idx <= idx + 32'd1;
        end

    // ---- bus memories: latency 1, byteenable, out of range reads 0 --------
    integer b;
    always @(posedge clock) begin
        if (avs_in_write && avs_in_address < WORDS)
            for (b = 0; b < 8; b = b + 1)
                if (avs_in_byteenable[b]) mem_in[avs_in_address][8*b+:8] <= avs_in_writedata[8*b+:8];
        if (avs_in_read)
            avs_in_readdata <= avs_in_address < WORDS ? mem_in[avs_in_address] : 64'd0;
        if (avs_out_write && avs_out_address < WORDS)
            for (b = 0; b < 8; b = b + 1)
                if (avs_out_byteenable[b]) mem_out[avs_out_address][8*b+:8] <= avs_out_writedata[8*b+:8];
        if (avs_out_read)
            avs_out_readdata <= avs_out_address < WORDS ? mem_out[avs_out_address] : 64'd0;
    end
endmodule
