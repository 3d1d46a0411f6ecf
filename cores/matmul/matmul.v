// matmul - corefarm reference core: 64x64 signed 32-bit matrix multiplier
// (seed 000 section 4.3.2.1), naive algorithm, one multiply-accumulate per
// cycle: 64*64*64 = 262144 cycles per job.
//
// Input memory (32768 bytes, 4096 words): A then B, row-major, little-endian
// int32, two elements per 64-bit word (low half = lower index).
// Output memory (16384 bytes, 2048 words): out[i][j] = sum_k A[i][k]*B[k][j]
// modulo 2^32. Port list and CSR map: cores/README.md.
module mat_mul_64x64 (
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
    localparam IN_WORDS = 4096;   // A: words 0..2047, B: words 2048..4095
    localparam OUT_WORDS = 2048;

    // Element-addressed RAMs; A and B are separate so both operands of a
    // multiply-accumulate are read in the same cycle.
    reg [31:0] mem_a[0:4095];
    reg [31:0] mem_b[0:4095];
    reg [31:0] mem_o[0:4095];

    // ---------------------------------------------------------------- CSR
    wire busy;
    reg [17:0] step;  // {i, j, k} of the multiply-accumulate in progress
    wire finish = busy && step == 18'h3FFFF;
    cf_csr csr (
        .clock(clock), .resetn(resetn),
        .address(avs_cra_address), .read(avs_cra_read), .write(avs_cra_write),
        .writedata(avs_cra_writedata), .byteenable(avs_cra_byteenable),
        .readdata(avs_cra_readdata), .finish(finish), .busy(busy), .irq(irq)
    );

    // ------------------------------------------------------------ datapath
    wire [5:0] i = step[17:12];
    wire [5:0] j = step[11:6];
    wire [5:0] k = step[5:0];
    reg  [31:0] acc;
    wire [31:0] sum = (k == 6'd0 ? 32'd0 : acc) + mem_a[{i, k}] * mem_b[{k, j}];

    always @(posedge clock) begin
        if (!resetn || !busy) step <= 18'd0;
        else begin
            acc <= sum;
            if (k == 6'd63) mem_o[{i, j}] <= sum;
            step <= step + 18'd1;
        end
    end

    // ---------------------------------------------------------- bus memories
    // Word w holds elements 2w (bytes 0-3) and 2w+1 (bytes 4-7).
    integer b;
    always @(posedge clock) begin
        if (avs_in_write && avs_in_address < IN_WORDS)
            for (b = 0; b < 8; b = b + 1)
                if (avs_in_byteenable[b]) begin
                    if (avs_in_address[11])
                        mem_b[{avs_in_address[10:0], b[2]}][8*b[1:0]+:8] <= avs_in_writedata[8*b+:8];
                    else
                        mem_a[{avs_in_address[10:0], b[2]}][8*b[1:0]+:8] <= avs_in_writedata[8*b+:8];
                end
        if (avs_in_read)
            avs_in_readdata <= avs_in_address >= IN_WORDS ? 64'd0 :
                avs_in_address[11] ? {mem_b[{avs_in_address[10:0], 1'b1}], mem_b[{avs_in_address[10:0], 1'b0}]}
                                   : {mem_a[{avs_in_address[10:0], 1'b1}], mem_a[{avs_in_address[10:0], 1'b0}]};
        if (avs_out_write && avs_out_address < OUT_WORDS)
            for (b = 0; b < 8; b = b + 1)
                if (avs_out_byteenable[b])
                    mem_o[{avs_out_address[10:0], b[2]}][8*b[1:0]+:8] <= avs_out_writedata[8*b+:8];
        if (avs_out_read)
            avs_out_readdata <= avs_out_address >= OUT_WORDS ? 64'd0 :
                {mem_o[{avs_out_address[10:0], 1'b1}], mem_o[{avs_out_address[10:0], 1'b0}]};
    end
endmodule
