mod unpack;
