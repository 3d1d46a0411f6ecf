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
    output reg [63:0] avs_cra_readdata,
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
    reg busy, int_enable;
    // done exists only so the register map matches; it never rises.
    wire done = 1'b0;
    assign irq = done & int_enable;

    always @(posedge clock) begin
        if (!resetn) begin
            busy <= 1'b0;
            int_enable <= 1'b0;
            avs_cra_readdata <= 64'd0;
        end else begin
            if (avs_cra_read)
                case (avs_cra_address)
                    32'd0: avs_cra_readdata <= {63'd0, busy};
                    32'd2: avs_cra_readdata <= {63'd0, int_enable};
                    32'd3: avs_cra_readdata <= {63'd0, done};
                    default: avs_cra_readdata <= 64'd0;
                endcase
            if (avs_cra_write && avs_cra_address == 32'd2 && avs_cra_byteenable[0])
                int_enable <= avs_cra_writedata[0];
            if (avs_cra_write && avs_cra_address == 32'd1 &&
                avs_cra_byteenable[0] && avs_cra_writedata[0])
                busy <= 1'b1;
        end
    end

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
