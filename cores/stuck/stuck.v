// stuck - corefarm test core that hangs: it accepts start, goes busy and
// never raises done. Used to test hung-core handling (timeouts, reset).
// Input and output memories are 16 bytes (2 words) each and behave like
// ordinary RAMs. Port list and CSR map: cores/README.md.
module stuck (
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
    reg [63:0] mem_i[0:1];
    reg [63:0] mem_o[0:1];
    // The job never finishes: busy rises on start and stays, done never rises.
    wire busy;
    wire finish = 1'b0;
    cf_csr csr (
        .clock(clock), .resetn(resetn),
        .address(avs_cra_address), .read(avs_cra_read), .write(avs_cra_write),
        .writedata(avs_cra_writedata), .byteenable(avs_cra_byteenable),
        .readdata(avs_cra_readdata), .finish(finish), .busy(busy), .irq(irq)
    );

    integer b;
    always @(posedge clock) begin
        if (avs_in_write && avs_in_address < 2)
            for (b = 0; b < 8; b = b + 1)
                if (avs_in_byteenable[b]) mem_i[avs_in_address[0]][8*b+:8] <= avs_in_writedata[8*b+:8];
        if (avs_in_read) avs_in_readdata <= avs_in_address < 2 ? mem_i[avs_in_address[0]] : 64'd0;
        if (avs_out_write && avs_out_address < 2)
            for (b = 0; b < 8; b = b + 1)
                if (avs_out_byteenable[b]) mem_o[avs_out_address[0]][8*b+:8] <= avs_out_writedata[8*b+:8];
        if (avs_out_read) avs_out_readdata <= avs_out_address < 2 ? mem_o[avs_out_address[0]] : 64'd0;
    end
endmodule
