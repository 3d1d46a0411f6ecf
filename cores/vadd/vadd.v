// vadd - corefarm reference core: adds two vectors of N = 1024 signed 8-bit
// elements with wrap-around (seed 000 section 3.4.1.2 example).
//
// Input memory (2048 bytes, 256 words): a[0..1023] then b[0..1023].
// Output memory (1024 bytes, 128 words): out[i] = a[i] + b[i] (mod 256).
// Computes one 64-bit word (8 lanes) per cycle: 128 cycles per job.
// Port list and CSR map: cores/README.md.
module vadd (
    input             clock,
    input             resetn,
    // Control/status registers (word 0 busy, 1 start, 2 irq enable, 3 done)
    input      [31:0] avs_cra_address,
    input             avs_cra_read,
    input             avs_cra_write,
    input      [63:0] avs_cra_writedata,
    input       [7:0] avs_cra_byteenable,
    output     [63:0] avs_cra_readdata,
    // Input memory
    input      [31:0] avs_in_address,
    input             avs_in_read,
    input             avs_in_write,
    input      [63:0] avs_in_writedata,
    input       [7:0] avs_in_byteenable,
    output reg [63:0] avs_in_readdata,
    // Output memory
    input      [31:0] avs_out_address,
    input             avs_out_read,
    input             avs_out_write,
    input      [63:0] avs_out_writedata,
    input       [7:0] avs_out_byteenable,
    output reg [63:0] avs_out_readdata,
    output            irq
);
    localparam WORDS = 128;  // 64-bit words per vector

    // a and b live in separate banks so both are read in the same cycle.
    reg [63:0] mem_a[0:WORDS-1];
    reg [63:0] mem_b[0:WORDS-1];
    reg [63:0] mem_o[0:WORDS-1];

    // ---------------------------------------------------------------- CSR
    wire busy;
    reg [7:0] idx;  // word being computed while busy
    wire finish = busy && idx == WORDS - 1;
    cf_csr csr (
        .clock(clock), .resetn(resetn),
        .address(avs_cra_address), .read(avs_cra_read), .write(avs_cra_write),
        .writedata(avs_cra_writedata), .byteenable(avs_cra_byteenable),
        .readdata(avs_cra_readdata), .finish(finish), .busy(busy), .irq(irq)
    );

    // ------------------------------------------------------------ datapath
    function [63:0] add_lanes(input [63:0] x, input [63:0] y);
        integer l;
        for (l = 0; l < 8; l = l + 1) add_lanes[8*l+:8] = x[8*l+:8] + y[8*l+:8];
    endfunction

    always @(posedge clock) begin
        if (!resetn || !busy) idx <= 8'd0;
        else begin
            mem_o[idx[6:0]] <= add_lanes(mem_a[idx[6:0]], mem_b[idx[6:0]]);
            idx <= idx + 8'd1;
        end
    end

    // ---------------------------------------------------------- bus memories
    integer b;
    always @(posedge clock) begin
        if (avs_in_write && avs_in_address < 2 * WORDS)
            for (b = 0; b < 8; b = b + 1)
                if (avs_in_byteenable[b]) begin
                    if (avs_in_address[7]) mem_b[avs_in_address[6:0]][8*b+:8] <= avs_in_writedata[8*b+:8];
                    else mem_a[avs_in_address[6:0]][8*b+:8] <= avs_in_writedata[8*b+:8];
                end
        if (avs_in_read)
            avs_in_readdata <= avs_in_address >= 2 * WORDS ? 64'd0 :
                               avs_in_address[7] ? mem_b[avs_in_address[6:0]] : mem_a[avs_in_address[6:0]];
        if (avs_out_write && avs_out_address < WORDS)
            for (b = 0; b < 8; b = b + 1)
                if (avs_out_byteenable[b]) mem_o[avs_out_address[6:0]][8*b+:8] <= avs_out_writedata[8*b+:8];
        if (avs_out_read)
            avs_out_readdata <= avs_out_address < WORDS ? mem_o[avs_out_address[6:0]] : 64'd0;
    end
endmodule
